//! The server crate's layering, as docs/ARCHITECTURE.md states it ("Module graph"), checked
//! against the code: every `crate::<module>` a module's code names (outside its tests) is on
//! a lower layer. An import that runs back up, or a circle, fails here with the module and
//! what it names.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Bottom up. A module may name only modules on lower layers (and the lock crate, which
/// is below them all).
const LAYERS: &[&[&str]] = &[
    &[
        "metrics", "records", "reload", "balance", "queue", "defects",
    ],
    &["error", "tls", "waiters"],
    &["kafka", "validate", "auth"],
    &["lease"],
    &["gateway"],
    &["subscribe", "calls", "metrics_endpoint", "dev"],
    &["grpc"],
    &["server"],
    &["config"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// Each module of `src/` (a file, or a folder of files) with the text of its files, tests
/// and comments cut.
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut modules = BTreeMap::new();
    for entry in std::fs::read_dir(src).expect("src/") {
        let path = entry.expect("an entry").path();
        let name = path
            .file_stem()
            .expect("a name")
            .to_string_lossy()
            .to_string();
        let files: Vec<PathBuf> = if path.is_dir() {
            std::fs::read_dir(&path)
                .expect("a module's folder")
                .map(|e| e.expect("an entry").path())
                .filter(|p| p.extension().is_some_and(|e| e == "rs"))
                .filter(|p| p.file_stem().is_some_and(|s| s != "tests"))
                .collect()
        } else if path.extension().is_some_and(|e| e == "rs") && name != "lib" && name != "main" {
            vec![path.clone()]
        } else {
            continue;
        };
        let mut text = String::new();
        for file in files {
            let source = std::fs::read_to_string(&file).expect("a source file");
            let code = source
                .split("#[cfg(test)]")
                .next()
                .unwrap_or_default()
                .lines()
                .map(|line| line.split("//").next().unwrap_or_default())
                .collect::<Vec<_>>()
                .join("\n");
            text.push_str(&code);
            text.push('\n');
        }
        modules.insert(name, text);
    }
    modules
}

/// The modules of `names` that `code` names as `crate::<module>`, also inside
/// `crate::{a, b::c}` groups.
fn named(code: &str, names: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        let words: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            group[..end]
                .split(',')
                .map(|part| part.trim().split("::").next().unwrap_or_default())
                .collect()
        } else {
            vec![rest
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .next()
                .unwrap_or_default()]
        };
        for word in words {
            if names.iter().any(|n| n == word) && !found.iter().any(|f| f == word) {
                found.push(word.to_string());
            }
        }
    }
    found
}

#[test]
fn no_module_names_one_on_its_layer_or_above() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = modules(&src);
    let names: Vec<String> = modules.keys().cloned().collect();
    let mut wrong = Vec::new();
    for (module, code) in &modules {
        let Some(layer) = layer_of(module) else {
            wrong.push(format!(
                "{module} is on no layer: add it to LAYERS and to docs/ARCHITECTURE.md"
            ));
            continue;
        };
        for dependency in named(code, &names) {
            if dependency == *module {
                continue;
            }
            match layer_of(&dependency) {
                Some(below) if below < layer => {}
                _ => wrong.push(format!(
                    "{module} (layer {layer}) names crate::{dependency} (layer {:?})",
                    layer_of(&dependency)
                )),
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the layering:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_check_sees_an_import_that_runs_back_up() {
    let names = vec![
        "gateway".to_string(),
        "grpc".to_string(),
        "lease".to_string(),
    ];
    let code = "use crate::{lease::Lease, grpc::status_of};\nfn f() { crate::gateway::x(); }";
    assert_eq!(named(code, &names), ["lease", "grpc", "gateway"]);
    assert!(layer_of("grpc") > layer_of("gateway"));
}
