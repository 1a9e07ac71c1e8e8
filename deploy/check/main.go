// Command check validates kafka-lease's deployment files strictly and offline.
//
// Usage, from the repository root:
//
//	go -C deploy/check run . [repo-root]
//
// The repository root defaults to the nearest directory, from the current one
// upward, that holds deploy/kubernetes/kafka-lease.yaml; a relative repo-root
// argument is taken relative to the current directory (deploy/check under -C).
// It prints one "ok" line per file checked and exits 0, or prints one
// "deploy-check: <file>: <what>: <problem>" line per problem to stderr and exits 1.
//
// deploy/kubernetes/kafka-lease.yaml: each document is decoded, by its
// apiVersion and kind, into the typed Kubernetes structs (apps/v1 Deployment,
// v1 Service, policy/v1 PodDisruptionBudget; any other kind is an error) the way
// the API server decodes them: case-sensitive field names, no unknown or
// duplicate fields, the right type for every value. Then come the checks a schema
// cannot express, each something kubectl apply would reject or that leaves the
// gateway not working:
//   - the Deployment's selector matches its pod template's labels;
//   - terminationGracePeriodSeconds is set (the gateway releases its leases on SIGTERM);
//   - every probe has one handler, and its port (grpc.port, tcpSocket.port,
//     httpGet.port, by number or by name) is a declared port of that container;
//   - each env var has exactly one of value and valueFrom, valueFrom has one source,
//     and a fieldRef's fieldPath is one the downward API offers to env vars;
//   - a $(VAR) in an env value names a variable defined earlier in the same list
//     (Kubernetes expands only those and leaves the rest as literal text), and one in
//     command or args names a variable of the container;
//   - resource requests do not exceed limits;
//   - the Service and the PodDisruptionBudget select the Deployment's pods, and each
//     named Service targetPort is a port name of those pods' containers.
//
// docker-compose.yml: loaded with compose-go, as docker compose loads it: validated
// against the compose-spec JSON schema embedded in that module (so an unknown key
// fails), interpolated with an empty environment and no .env file, paths resolved
// against the repository root, and every depends_on checked to name a service (the
// loader's consistency check). The loader's warnings count as problems (a ${VAR}
// with no default, say). Then each build context and Dockerfile must exist.
// Neither Docker nor the network is used.
//
// Not kubeconform: it downloads its JSON schemas at run time, from a host the
// machines this project builds on cannot reach.
package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/sirupsen/logrus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

const (
	manifestFile = "deploy/kubernetes/kafka-lease.yaml"
	composeFile  = "docker-compose.yml"
)

func main() {
	root, err := repoRoot(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "deploy-check:", err)
		os.Exit(2)
	}
	failed := false
	for _, c := range []struct {
		file  string
		check func(root, path string) (summary string, problems []string)
	}{{manifestFile, checkManifest}, {composeFile, checkCompose}} {
		summary, problems := c.check(root, filepath.Join(root, filepath.FromSlash(c.file)))
		for _, p := range problems {
			p = strings.TrimSpace(multiline.ReplaceAllString(p, " ")) // one line per problem
			fmt.Fprintf(os.Stderr, "deploy-check: %s: %s\n", c.file, p)
		}
		if len(problems) > 0 {
			failed = true
		} else {
			fmt.Printf("ok %s: %s\n", c.file, summary)
		}
	}
	if failed {
		os.Exit(1)
	}
}

var multiline = regexp.MustCompile(`\s*\n\s*`)

func repoRoot(args []string) (string, error) {
	switch len(args) {
	case 0:
	case 1:
		return args[0], nil
	default:
		return "", errors.New("usage: check [repo-root]")
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, filepath.FromSlash(manifestFile))); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no %s in the current directory or above it; pass the repository root", manifestFile)
		}
		dir = parent
	}
}

// manifest collects what the documents of the Kubernetes file hold, and its problems.
type manifest struct {
	problems    []string
	names       []string // "Deployment kafka-lease", in file order
	deployments []*appsv1.Deployment
	services    []*corev1.Service
	pdbs        []*policyv1.PodDisruptionBudget
	undecoded   bool // a document failed to decode, so cross-document checks may miss it
}

func (m *manifest) addf(where, format string, args ...any) {
	m.problems = append(m.problems, where+": "+fmt.Sprintf(format, args...))
}

func checkManifest(_, path string) (string, []string) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", []string{err.Error()}
	}
	var m manifest
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for n := 1; ; {
		doc, err := reader.Read()
		if err == io.EOF {
			break
		} else if err != nil {
			m.addf(fmt.Sprintf("document %d", n), "%v", err)
			m.undecoded = true
			break
		}
		if m.decode(n, doc) {
			n++
		}
	}
	for _, d := range m.deployments {
		m.checkDeployment(d)
	}
	for _, s := range m.services {
		m.checkService(s)
	}
	for _, p := range m.pdbs {
		m.checkPDB(p)
	}
	return strings.Join(m.names, ", "), m.problems
}

// decode decodes one document into its typed struct and reports whether it held anything.
func (m *manifest) decode(n int, doc []byte) bool {
	j, yamlErr := yaml.YAMLToJSONStrict(doc) // fails on duplicate keys too
	if yamlErr != nil {
		j, _ = yaml.YAMLToJSON(doc) // only to name the object in the message
	} else if string(bytes.TrimSpace(j)) == "null" {
		return false // only comments
	}
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	headErr := kjson.UnmarshalCaseSensitivePreserveInts(j, &head)
	where := fmt.Sprintf("document %d", n)
	if head.Kind != "" {
		where = strings.TrimSpace(head.Kind + " " + head.Metadata.Name)
	}
	if yamlErr != nil || headErr != nil {
		m.addf(where, "%v", cmp.Or(yamlErr, errors.New("not a Kubernetes object (a mapping with apiVersion and kind)")))
		m.undecoded = true
		return true
	}
	var obj any
	switch head.APIVersion + " " + head.Kind {
	case "apps/v1 Deployment":
		obj = &appsv1.Deployment{}
	case "v1 Service":
		obj = &corev1.Service{}
	case "policy/v1 PodDisruptionBudget":
		obj = &policyv1.PodDisruptionBudget{}
	default:
		m.addf(where, "unknown apiVersion/kind %q/%q (known: apps/v1 Deployment, v1 Service, policy/v1 PodDisruptionBudget)", head.APIVersion, head.Kind)
		m.undecoded = true
		return true
	}
	strict, err := kjson.UnmarshalStrict(j, obj) // case-sensitive, no unknown or duplicate fields
	if err != nil {
		m.addf(where, "%v", err)
		m.undecoded = true
		return true
	}
	for _, e := range strict {
		m.addf(where, "%v", e)
	}
	if len(strict) > 0 { // the checks below would only repeat these
		m.undecoded = true
		return true
	}
	if head.Metadata.Name == "" {
		m.addf(where, "metadata.name is not set")
	}
	m.names = append(m.names, where)
	switch o := obj.(type) {
	case *appsv1.Deployment:
		m.deployments = append(m.deployments, o)
	case *corev1.Service:
		m.services = append(m.services, o)
	case *policyv1.PodDisruptionBudget:
		m.pdbs = append(m.pdbs, o)
	}
	return true
}

func (m *manifest) checkDeployment(d *appsv1.Deployment) {
	where := "Deployment " + d.Name
	tpl := &d.Spec.Template
	if sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector); err != nil {
		m.addf(where, "spec.selector: %v", err)
	} else if d.Spec.Selector == nil || sel.Empty() {
		m.addf(where, "spec.selector is empty (apps/v1 requires one)")
	} else if !sel.Matches(labels.Set(tpl.Labels)) {
		m.addf(where, "spec.selector %q does not match spec.template.metadata.labels %q", sel, labels.Set(tpl.Labels))
	}
	if tpl.Spec.TerminationGracePeriodSeconds == nil {
		m.addf(where, "spec.template.spec.terminationGracePeriodSeconds is not set")
	}
	if len(tpl.Spec.Containers) == 0 {
		m.addf(where, "spec.template.spec.containers is empty")
	}
	for i := range tpl.Spec.Containers {
		m.checkContainer(where, &tpl.Spec.Containers[i])
	}
}

// envFieldPaths are the fieldRef paths the downward API offers to env vars (besides
// metadata.labels['KEY'] and metadata.annotations['KEY']).
var envFieldPaths = []string{"metadata.name", "metadata.namespace", "metadata.uid",
	"spec.nodeName", "spec.serviceAccountName", "status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs"}

var subscriptFieldPath = regexp.MustCompile(`^metadata\.(labels|annotations)\['[^']+'\]$`)

func (m *manifest) checkContainer(where string, c *corev1.Container) {
	at := fmt.Sprintf("spec.template.spec.containers[%s]", c.Name)
	numbers, names := map[int32]bool{}, map[string]bool{}
	var declared []string
	for _, p := range c.Ports {
		numbers[p.ContainerPort], names[p.Name] = true, p.Name != ""
		declared = append(declared, strings.TrimPrefix(fmt.Sprintf("%s=%d", p.Name, p.ContainerPort), "="))
	}
	checkPort := func(field string, port intstr.IntOrString) {
		if port.Type == intstr.String && !names[port.StrVal] || port.Type == intstr.Int && !numbers[port.IntVal] {
			m.addf(where, "%s.%s: %s is not a declared port of the container (ports: %s)", at, field, port.String(), strings.Join(declared, ", "))
		}
	}
	for _, pr := range []struct {
		field string
		probe *corev1.Probe
	}{{"readinessProbe", c.ReadinessProbe}, {"livenessProbe", c.LivenessProbe}, {"startupProbe", c.StartupProbe}} {
		p := pr.probe
		if p == nil {
			continue
		}
		if count(p.Exec != nil, p.HTTPGet != nil, p.TCPSocket != nil, p.GRPC != nil) != 1 {
			m.addf(where, "%s.%s: needs exactly one of exec, httpGet, tcpSocket, grpc", at, pr.field)
		}
		if p.GRPC != nil {
			checkPort(pr.field+".grpc.port", intstr.FromInt32(p.GRPC.Port))
		}
		if p.TCPSocket != nil {
			checkPort(pr.field+".tcpSocket.port", p.TCPSocket.Port)
		}
		if p.HTTPGet != nil {
			checkPort(pr.field+".httpGet.port", p.HTTPGet.Port)
		}
	}

	// Env vars: Kubernetes expands $(NAME) only for NAMEs defined earlier in the list.
	later := map[string]bool{}
	for _, e := range c.Env {
		later[e.Name] = true
	}
	earlier := map[string]bool{}
	for _, e := range c.Env {
		field := fmt.Sprintf("%s.env[%s]", at, e.Name)
		if e.Name == "" {
			m.addf(where, "%s: name is empty", field)
		}
		if (e.Value != "") == (e.ValueFrom != nil) {
			m.addf(where, "%s: needs exactly one of value and valueFrom", field)
		}
		if f := e.ValueFrom; f != nil {
			if count(f.FieldRef != nil, f.ResourceFieldRef != nil, f.ConfigMapKeyRef != nil, f.SecretKeyRef != nil, f.FileKeyRef != nil) != 1 {
				m.addf(where, "%s.valueFrom: needs exactly one of fieldRef, resourceFieldRef, configMapKeyRef, secretKeyRef, fileKeyRef", field)
			}
			if r := f.FieldRef; r != nil {
				if !slices.Contains(envFieldPaths, r.FieldPath) && !subscriptFieldPath.MatchString(r.FieldPath) {
					m.addf(where, "%s.valueFrom.fieldRef.fieldPath: %q is not offered to env vars (supported: %s, metadata.labels['KEY'], metadata.annotations['KEY'])",
						field, r.FieldPath, strings.Join(envFieldPaths, ", "))
				}
				if r.APIVersion != "" && r.APIVersion != "v1" {
					m.addf(where, "%s.valueFrom.fieldRef.apiVersion: %q is not v1", field, r.APIVersion)
				}
			}
		}
		for _, ref := range envRefs(e.Value) {
			switch {
			case earlier[ref]:
			case later[ref]:
				m.addf(where, "%s.value: $(%s) refers to a variable defined later in env; Kubernetes only expands earlier ones, so it stays literal text", field, ref)
			case len(c.EnvFrom) == 0: // with envFrom, it may come from there
				m.addf(where, "%s.value: $(%s) refers to a variable not defined in env", field, ref)
			}
		}
		earlier[e.Name] = true
	}
	for i, s := range append(slices.Clone(c.Command), c.Args...) {
		field := fmt.Sprintf("command[%d]", i)
		if i >= len(c.Command) {
			field = fmt.Sprintf("args[%d]", i-len(c.Command))
		}
		for _, ref := range envRefs(s) {
			if !later[ref] && len(c.EnvFrom) == 0 {
				m.addf(where, "%s.%s: $(%s) refers to a variable not defined in env", at, field, ref)
			}
		}
	}

	for _, name := range slices.Sorted(maps.Keys(c.Resources.Requests)) {
		req := c.Resources.Requests[name]
		if lim, ok := c.Resources.Limits[name]; ok && req.Cmp(lim) > 0 {
			m.addf(where, "%s.resources: requests.%s %s exceeds limits.%s %s", at, name, req.String(), name, lim.String())
		}
	}
}

// envRefs returns the NAMEs of the $(NAME) references in s, read as Kubernetes reads
// them: "$$" is an escaped "$", and "$(" with no closing ")" is literal text.
func envRefs(s string) []string {
	var refs []string
	for i := 0; i+1 < len(s); i++ {
		if s[i] != '$' {
			continue
		}
		if s[i+1] == '$' {
			i++
		} else if end := strings.IndexByte(s[i+1:], ')'); s[i+1] == '(' && end > 1 {
			refs = append(refs, s[i+2:i+1+end])
			i += end
		}
	}
	return refs
}

func count(conds ...bool) int {
	n := 0
	for _, c := range conds {
		if c {
			n++
		}
	}
	return n
}

// selected returns the Deployments whose pod template labels sel matches.
func (m *manifest) selected(sel labels.Selector) []*appsv1.Deployment {
	var out []*appsv1.Deployment
	for _, d := range m.deployments {
		if sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			out = append(out, d)
		}
	}
	return out
}

// noPods reports a selector that matches no Deployment's pods, unless a Deployment
// may have failed to decode.
func (m *manifest) noPods(where, field string, sel labels.Selector) {
	if !m.undecoded {
		m.addf(where, "%s %q matches the pod template labels of no Deployment in the file", field, sel)
	}
}

func (m *manifest) checkService(s *corev1.Service) {
	where := "Service " + s.Name
	if len(s.Spec.Ports) == 0 {
		m.addf(where, "spec.ports is empty")
	}
	if len(s.Spec.Selector) == 0 {
		m.addf(where, "spec.selector is empty, so the Service routes to no pods")
		return
	}
	sel := labels.SelectorFromSet(s.Spec.Selector)
	deployments := m.selected(sel)
	if len(deployments) == 0 {
		m.noPods(where, "spec.selector", sel)
		return
	}
	names := map[string]bool{}
	for _, d := range deployments {
		for _, c := range d.Spec.Template.Spec.Containers {
			for _, p := range c.Ports {
				names[p.Name] = p.Name != ""
			}
		}
	}
	for _, p := range s.Spec.Ports {
		if p.TargetPort.Type == intstr.String && !names[p.TargetPort.StrVal] {
			m.addf(where, "spec.ports[%s].targetPort: %q is not a port name of the selected pods' containers", p.Name, p.TargetPort.StrVal)
		}
	}
}

func (m *manifest) checkPDB(p *policyv1.PodDisruptionBudget) {
	where := "PodDisruptionBudget " + p.Name
	if p.Spec.MinAvailable != nil && p.Spec.MaxUnavailable != nil {
		m.addf(where, "spec: minAvailable and maxUnavailable cannot both be set")
	}
	if p.Spec.Selector == nil {
		m.addf(where, "spec.selector is not set, so the budget covers no pods")
		return
	}
	sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
	if err != nil {
		m.addf(where, "spec.selector: %v", err)
	} else if len(m.selected(sel)) == 0 {
		m.noPods(where, "spec.selector", sel)
	}
}

var falseSchema = regexp.MustCompile(`(?m)^(\S+) false schema$`)

type warnings []string

func (w *warnings) Levels() []logrus.Level {
	return []logrus.Level{logrus.ErrorLevel, logrus.WarnLevel}
}

func (w *warnings) Fire(e *logrus.Entry) error {
	*w = append(*w, e.Message)
	return nil
}

// checkCompose loads the compose file as docker compose would, minus the
// environment: no OS variables, no .env file, no remote resource loaders.
func checkCompose(root, path string) (string, []string) {
	absRoot, err := filepath.Abs(root)
	if err != nil {
		return "", []string{err.Error()}
	}
	opts, err := cli.NewProjectOptions([]string{path}, cli.WithWorkingDirectory(absRoot))
	if err != nil {
		return "", []string{err.Error()}
	}
	// The loader's warnings (such as a variable that is not set and has no default,
	// so it becomes "") are problems too.
	var problems warnings
	logrus.SetOutput(io.Discard)
	logrus.AddHook(&problems)
	project, err := opts.LoadProject(context.Background())
	if err != nil {
		msg := strings.ReplaceAll(err.Error(), absRoot+string(filepath.Separator), "")
		msg = strings.TrimPrefix(msg, "validating "+composeFile+": ")
		// The schema rejects an unknown key with a bare "false schema".
		msg = falseSchema.ReplaceAllString(msg, "$1: unknown or misplaced key (not in the compose-spec schema)")
		if rest, ok := strings.CutPrefix(msg, " additional properties"); ok { // the top level's path is empty
			msg = "top level: additional properties" + rest
		}
		return "", append(problems, msg)
	}
	rel := func(p string) string {
		if r, err := filepath.Rel(absRoot, p); err == nil {
			return r
		}
		return p
	}
	names := slices.Sorted(maps.Keys(project.Services))
	for _, name := range names {
		b := project.Services[name].Build
		if b == nil {
			continue
		}
		if st, err := os.Stat(b.Context); err != nil || !st.IsDir() {
			problems = append(problems, fmt.Sprintf("service %s: build.context %s is not a directory", name, rel(b.Context)))
			continue
		}
		if b.DockerfileInline != "" {
			continue
		}
		dockerfile := cmp.Or(b.Dockerfile, "Dockerfile")
		if !filepath.IsAbs(dockerfile) {
			dockerfile = filepath.Join(b.Context, dockerfile)
		}
		if st, err := os.Stat(dockerfile); err != nil || st.IsDir() {
			problems = append(problems, fmt.Sprintf("service %s: build.dockerfile %s: no file %s", name, b.Dockerfile, rel(dockerfile)))
		}
	}
	return "services " + strings.Join(names, ", "), problems
}
