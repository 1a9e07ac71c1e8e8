//! Every line of the server's code fits rustfmt's width (100 columns). rustfmt leaves alone
//! what it cannot fit (a long string, a `select!` arm, a `proptest!` body, the statement
//! around either), and `cargo fmt --check` then passes on code nobody formatted; on stable
//! Rust, where `error_on_line_overflow` is not available, this test is that check.
//!
//! The one kind of line allowed past the width: an attribute that must hold a single
//! literal (`#[error("...")]` of thiserror, `#[arg(...)]` of clap), which no wrap can split.

use std::path::Path;

const WIDTH: usize = 100;

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a readable folder") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_line_of_the_server_fits_the_width_rustfmt_formats_to() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut over = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("a readable file");
        for (i, line) in text.lines().enumerate() {
            let trimmed = line.trim_start();
            let single_literal_attribute =
                trimmed.starts_with("#[error(") || trimmed.starts_with("#[arg(");
            if line.chars().count() > WIDTH && !single_literal_attribute {
                let shown = file.strip_prefix(&src).unwrap_or(file).display();
                over.push(format!(
                    "src/{shown}:{}: {} columns",
                    i + 1,
                    line.chars().count()
                ));
            }
        }
    }
    assert!(
        over.is_empty(),
        "lines over {WIDTH} columns (wrap them by hand: rustfmt gave up on them):\n{}",
        over.join("\n")
    );
}
