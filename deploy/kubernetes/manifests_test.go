// Package kubernetes holds the tests of the Kubernetes manifests in this
// directory (docs/kubernetes.md): that they parse, that they keep the
// promises the docs make of them (least privilege, a probe on the leader
// health check, a termination grace period that covers baton's shutdown),
// and that a real kube-apiserver accepts every one of them.
package kubernetes

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// The variants: directories with a kustomization.yaml that deploy a
// complete service. base is shared by both and deployed only through them.
var variants = []string{"run", "sidecar"}

// manifest is one YAML document of a file here.
type manifest struct {
	file string // relative to this directory
	doc  map[string]any
	raw  []byte // the document re-encoded, for typed decoding
}

func (m manifest) kind() string { s, _ := m.doc["kind"].(string); return s }
func (m manifest) name() string { s, _ := lookup(m.doc, "metadata", "name").(string); return s }
func (m manifest) String() string {
	return fmt.Sprintf("%s: %s %s", m.file, m.kind(), m.name())
}

// decode decodes the document into v (a struct with yaml tags).
func (m manifest) decode(t *testing.T, v any) {
	t.Helper()
	if err := yaml.Unmarshal(m.raw, v); err != nil {
		t.Fatalf("%s: %v", m, err)
	}
}

func lookup(v any, path ...string) any {
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[p]
	}
	return v
}

// yamlFiles returns the YAML files under this directory, relative to it,
// sorted.
func yamlFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && (strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	if len(files) == 0 {
		t.Fatal("no YAML files found")
	}
	return files
}

// parseFile decodes every document of a YAML file. yaml.v3 refuses
// duplicate keys, which kubectl would otherwise resolve silently.
func parseFile(path string) ([]map[string]any, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []map[string]any
	for i := 0; ; i++ {
		var doc map[string]any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		if doc == nil {
			continue // an empty document, as after a trailing ---
		}
		docs = append(docs, doc)
	}
}

// loadManifests returns every Kubernetes object in the YAML files here (not
// the kustomization files), failing the test on a file that does not parse.
func loadManifests(t *testing.T) []manifest {
	t.Helper()
	var out []manifest
	for _, f := range yamlFiles(t) {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		docs, err := parseFile(f)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, d := range docs {
			raw, err := yaml.Marshal(d)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			out = append(out, manifest{file: f, doc: d, raw: raw})
		}
	}
	return out
}

type kustomization struct {
	Namespace string   `yaml:"namespace"`
	Resources []string `yaml:"resources"`
	Images    []struct {
		Name    string `yaml:"name"`
		NewName string `yaml:"newName"`
		NewTag  string `yaml:"newTag"`
		Digest  string `yaml:"digest"`
	} `yaml:"images"`
}

func loadKustomization(t *testing.T, dir string) kustomization {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatalf("%s/kustomization.yaml: %v", dir, err)
	}
	return k
}

// TestManifestsParse checks that every YAML file here parses, that every
// object names its apiVersion, kind and name and leaves its namespace to
// the kustomization (or kubectl's -n), and that every object file is
// deployed by some kustomization, so none is left out of what the
// server-side test applies as a whole.
func TestManifestsParse(t *testing.T) {
	listed := map[string]bool{}
	for _, f := range yamlFiles(t) {
		docs, err := parseFile(f)
		if err != nil {
			t.Errorf("%s does not parse: %v", f, err)
			continue
		}
		if len(docs) == 0 {
			t.Errorf("%s holds no document", f)
		}
		if filepath.Base(f) == "kustomization.yaml" {
			dir := filepath.Dir(f)
			k := loadKustomization(t, dir)
			if len(k.Resources) == 0 {
				t.Errorf("%s lists no resources", f)
			}
			for _, r := range k.Resources {
				p := filepath.Join(dir, r)
				if _, err := os.Stat(p); err != nil {
					t.Errorf("%s: resource %s: %v", f, r, err)
				}
				listed[p] = true
			}
			continue
		}
		for i, d := range docs {
			for _, field := range [][]string{{"apiVersion"}, {"kind"}, {"metadata", "name"}} {
				if s, _ := lookup(d, field...).(string); s == "" {
					t.Errorf("%s, document %d: no %s", f, i+1, strings.Join(field, "."))
				}
			}
			if ns := lookup(d, "metadata", "namespace"); ns != nil {
				t.Errorf("%s, document %d: metadata.namespace %v: leave it to the kustomization or -n, so the files deploy to any namespace", f, i+1, ns)
			}
		}
	}
	for _, f := range yamlFiles(t) {
		if filepath.Base(f) != "kustomization.yaml" && !listed[f] {
			t.Errorf("%s is in no kustomization.yaml", f)
		}
	}
	for _, v := range variants {
		if k := loadKustomization(t, v); k.Namespace == "" {
			t.Errorf("%s/kustomization.yaml sets no namespace", v)
		}
	}
}

// The parts of the objects that the checks below read.
type (
	policyRule struct {
		APIGroups     []string `yaml:"apiGroups"`
		Resources     []string `yaml:"resources"`
		Verbs         []string `yaml:"verbs"`
		ResourceNames []string `yaml:"resourceNames"`
	}
	role struct {
		Rules []policyRule `yaml:"rules"`
	}
	roleBinding struct {
		RoleRef struct {
			Kind, Name string
		} `yaml:"roleRef"`
		Subjects []struct {
			Kind, Name, Namespace string
		} `yaml:"subjects"`
	}
	service struct {
		Spec struct {
			Selector                 map[string]string `yaml:"selector"`
			PublishNotReadyAddresses *bool             `yaml:"publishNotReadyAddresses"`
			Ports                    []struct {
				Name       string `yaml:"name"`
				TargetPort any    `yaml:"targetPort"`
			} `yaml:"ports"`
		} `yaml:"spec"`
	}
	securityContext struct {
		RunAsNonRoot             *bool `yaml:"runAsNonRoot"`
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
		Privileged               *bool `yaml:"privileged"`
		Capabilities             struct {
			Add  []string `yaml:"add"`
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
		SeccompProfile struct {
			Type string `yaml:"type"`
		} `yaml:"seccompProfile"`
	}
	containerPort struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	}
	container struct {
		Name          string   `yaml:"name"`
		Image         string   `yaml:"image"`
		Command       []string `yaml:"command"`
		Args          []string `yaml:"args"`
		RestartPolicy string   `yaml:"restartPolicy"`
		Env           []struct {
			Name      string `yaml:"name"`
			ValueFrom struct {
				FieldRef struct {
					FieldPath string `yaml:"fieldPath"`
				} `yaml:"fieldRef"`
			} `yaml:"valueFrom"`
		} `yaml:"env"`
		Ports          []containerPort `yaml:"ports"`
		ReadinessProbe *struct {
			HTTPGet struct {
				Path string `yaml:"path"`
				Port any    `yaml:"port"`
			} `yaml:"httpGet"`
		} `yaml:"readinessProbe"`
		LivenessProbe   any             `yaml:"livenessProbe"`
		SecurityContext securityContext `yaml:"securityContext"`
	}
	deployment struct {
		Spec struct {
			Strategy struct {
				Type          string `yaml:"type"`
				RollingUpdate struct {
					MaxUnavailable any `yaml:"maxUnavailable"`
				} `yaml:"rollingUpdate"`
			} `yaml:"strategy"`
			Template struct {
				Metadata struct {
					Labels map[string]string `yaml:"labels"`
				} `yaml:"metadata"`
				Spec struct {
					ServiceAccountName            string          `yaml:"serviceAccountName"`
					AutomountServiceAccountToken  *bool           `yaml:"automountServiceAccountToken"`
					TerminationGracePeriodSeconds *int            `yaml:"terminationGracePeriodSeconds"`
					SecurityContext               securityContext `yaml:"securityContext"`
					InitContainers                []container     `yaml:"initContainers"`
					Containers                    []container     `yaml:"containers"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
)

// TestRBACIsMinimal checks the permissions the manifests grant: one Role,
// in its own namespace only, with exactly the verbs baton uses: get, watch,
// create and update on Leases (the Kubernetes backend) and list and patch
// on pods (the leader label), bound to the ServiceAccount the Deployments
// run as; nothing cluster-wide.
func TestRBACIsMinimal(t *testing.T) {
	ms := loadManifests(t)
	var roles, bindings []manifest
	accounts := map[string]bool{}
	for _, m := range ms {
		switch m.kind() {
		case "ClusterRole", "ClusterRoleBinding":
			t.Errorf("%s: nothing cluster-wide: baton needs Leases and pods of one namespace only", m)
		case "Role":
			roles = append(roles, m)
		case "RoleBinding":
			bindings = append(bindings, m)
		case "ServiceAccount":
			accounts[m.name()] = true
		}
	}
	if len(roles) != 1 || len(bindings) != 1 {
		t.Fatalf("want one Role and one RoleBinding, got %d and %d", len(roles), len(bindings))
	}
	var r role
	roles[0].decode(t, &r)
	want := []policyRule{
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create", "get", "update", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "patch"}},
	}
	if len(r.Rules) != len(want) {
		t.Fatalf("%s: %d rules, want %d: %+v", roles[0], len(r.Rules), len(want), want)
	}
	for i, got := range r.Rules {
		slices.Sort(got.Verbs)
		if !slices.Equal(got.APIGroups, want[i].APIGroups) || !slices.Equal(got.Resources, want[i].Resources) ||
			!slices.Equal(got.Verbs, want[i].Verbs) || len(got.ResourceNames) != 0 {
			t.Errorf("%s: rule %d %+v, want %+v", roles[0], i, got, want[i])
		}
	}
	var b roleBinding
	bindings[0].decode(t, &b)
	if b.RoleRef.Kind != "Role" || b.RoleRef.Name != roles[0].name() {
		t.Errorf("%s: roleRef %s %s, want Role %s", bindings[0], b.RoleRef.Kind, b.RoleRef.Name, roles[0].name())
	}
	if len(b.Subjects) != 1 || b.Subjects[0].Kind != "ServiceAccount" || !accounts[b.Subjects[0].Name] {
		t.Fatalf("%s: subjects %+v, want the one ServiceAccount defined here", bindings[0], b.Subjects)
	}
	if b.Subjects[0].Namespace != "" {
		t.Errorf("%s: subject namespace %q: leave it out, so it is the RoleBinding's own", bindings[0], b.Subjects[0].Namespace)
	}
	for _, m := range ms {
		if m.kind() != "Deployment" {
			continue
		}
		var d deployment
		m.decode(t, &d)
		if sa := d.Spec.Template.Spec.ServiceAccountName; sa != b.Subjects[0].Name {
			t.Errorf("%s: serviceAccountName %q, want %q, the one the RoleBinding grants", m, sa, b.Subjects[0].Name)
		}
	}
}

// batonFlags returns the flags of a `baton run` container's args, before
// "--", as name → value (--name=value only: the manifests spell every
// flag that way so that this check and a reader see the same thing).
func batonFlags(t *testing.T, m manifest, c container) map[string]string {
	t.Helper()
	if !slices.Equal(c.Command, []string{"baton"}) || len(c.Args) == 0 || c.Args[0] != "run" {
		t.Fatalf("%s: container %s: command %q args %q, want baton run", m, c.Name, c.Command, c.Args)
	}
	flags := map[string]string{}
	dash := slices.Index(c.Args, "--")
	if dash < 0 || dash == len(c.Args)-1 {
		t.Fatalf("%s: container %s: no command after --: %q", m, c.Name, c.Args)
	}
	for _, a := range c.Args[1:dash] {
		name, value, ok := strings.Cut(a, "=")
		if !ok || !strings.HasPrefix(name, "--") {
			t.Fatalf("%s: container %s: argument %q: want --flag=value", m, c.Name, a)
		}
		flags[strings.TrimPrefix(name, "--")] = value
	}
	return flags
}

// shutdownBudget is the longest `baton run` takes, after its command has
// stopped, to exit on SIGTERM: releasing the lease (the Elector's
// ResignTimeout, 5s), closing the backend (5s, and 5s more before it
// gives up waiting: closeWithin and closeOverrun in cmd/baton/run.go) and
// shutting down the --http server (2s, httpServer.close). The
// docs/kubernetes.md arithmetic uses the same figures.
const shutdownBudget = (5 + 5 + 5 + 2) * time.Second

// TestDeployments checks what docs/kubernetes.md promises of each
// Deployment: baton run on k8s:// with --id from the pod name, its HTTP
// health check served where the kubelet can reach it and used, with
// ?standbyok=true, as the readiness probe (and not as a liveness probe),
// the leader label that the leader Service selects, a disruption budget
// over the pods, a grace period that covers baton's shutdown, and
// containers that run as non-root, on a read-only root filesystem, without
// privilege escalation or capabilities.
func TestDeployments(t *testing.T) {
	ms := loadManifests(t)
	var deployments []manifest
	var svc, pdb *manifest
	for i, m := range ms {
		switch m.kind() {
		case "Deployment":
			deployments = append(deployments, m)
		case "PodDisruptionBudget":
			pdb = &ms[i]
		case "Service":
			if svc != nil {
				t.Fatalf("two Services: %s and %s", svc, m)
			}
			svc = &ms[i]
		}
	}
	if len(deployments) != len(variants) {
		t.Fatalf("%d Deployments, want one per variant %q", len(deployments), variants)
	}
	if svc == nil {
		t.Fatal("no leader Service")
	}
	var s service
	svc.decode(t, &s)
	if s.Spec.PublishNotReadyAddresses == nil || *s.Spec.PublishNotReadyAddresses {
		t.Errorf("%s: publishNotReadyAddresses must be spelt out false: a labelled pod that is not Ready is no endpoint", svc)
	}
	if len(s.Spec.Selector) == 0 {
		t.Errorf("%s: no selector", svc)
	}
	if pdb == nil {
		t.Fatal("no PodDisruptionBudget")
	}
	var budget struct {
		Spec struct {
			MaxUnavailable any `yaml:"maxUnavailable"`
			Selector       struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			} `yaml:"selector"`
		} `yaml:"spec"`
	}
	pdb.decode(t, &budget)
	if fmt.Sprint(budget.Spec.MaxUnavailable) != "1" || len(budget.Spec.Selector.MatchLabels) == 0 {
		t.Errorf("%s: %+v, want maxUnavailable 1 over the Deployment's pods", pdb, budget.Spec)
	}

	for _, m := range deployments {
		t.Run(filepath.Dir(m.file), func(t *testing.T) {
			var d deployment
			m.decode(t, &d)
			pod := d.Spec.Template.Spec
			for k, v := range budget.Spec.Selector.MatchLabels {
				if d.Spec.Template.Metadata.Labels[k] != v {
					t.Errorf("the disruption budget selects %s=%s, which the pod template's labels %v lack", k, v, d.Spec.Template.Metadata.Labels)
				}
			}
			if d.Spec.Strategy.Type != "RollingUpdate" || fmt.Sprint(d.Spec.Strategy.RollingUpdate.MaxUnavailable) != "0" {
				t.Errorf("strategy %+v: want RollingUpdate with maxUnavailable 0: every healthy pod is Ready, so a rollout can keep them all available", d.Spec.Strategy)
			}
			if pod.AutomountServiceAccountToken != nil && !*pod.AutomountServiceAccountToken {
				t.Error("automountServiceAccountToken false: baton needs the token for the in-cluster configuration")
			}

			all := append(append([]container(nil), pod.InitContainers...), pod.Containers...)
			var batons []container
			for _, c := range all {
				if slices.Equal(c.Command, []string{"baton"}) {
					batons = append(batons, c)
				}
				checkSecurity(t, c, pod.SecurityContext)
			}
			if len(batons) != 1 {
				t.Fatalf("%d containers run baton, want one", len(batons))
			}
			c := batons[0]
			if slices.ContainsFunc(pod.InitContainers, func(ic container) bool { return ic.Name == c.Name }) && c.RestartPolicy != "Always" {
				t.Errorf("baton is an init container with restartPolicy %q: a sidecar needs Always, or the program would wait for it to exit", c.RestartPolicy)
			}
			flags := batonFlags(t, m, c)

			env := map[string]string{}
			for _, e := range c.Env {
				env[e.Name] = e.ValueFrom.FieldRef.FieldPath
			}
			if flags["id"] != "$(POD_NAME)" || env["POD_NAME"] != "metadata.name" {
				t.Errorf("--id=%s with POD_NAME from %q: want --id=$(POD_NAME) from the downward API's metadata.name", flags["id"], env["POD_NAME"])
			}
			if b := flags["backend"]; !strings.HasPrefix(b, "k8s://") {
				t.Errorf("--backend=%s: want k8s://", b)
			} else if ns := strings.TrimPrefix(b, "k8s://"); ns != "" && (ns != "$(POD_NAMESPACE)" || env["POD_NAMESPACE"] != "metadata.namespace") {
				t.Errorf("--backend=%s: the namespace must be the pod's own, $(POD_NAMESPACE) from metadata.namespace", b)
			}
			if flags["lease"] == "" {
				t.Error("no --lease")
			}
			// The leader Service selects the app's pods that carry the
			// leader label, and nothing else.
			key, value, ok := strings.Cut(flags["leader-label"], "=")
			if !ok {
				t.Errorf("--leader-label=%q: want KEY=VALUE, the label the leader Service selects", flags["leader-label"])
			}
			for k, v := range s.Spec.Selector {
				if d.Spec.Template.Metadata.Labels[k] != v && k != key {
					t.Errorf("the leader Service selects %s=%s, which the pod template's labels %v lack", k, v, d.Spec.Template.Metadata.Labels)
				}
			}
			if s.Spec.Selector[key] != value {
				t.Errorf("the leader Service's selector %v lacks the leader label %s=%s", s.Spec.Selector, key, value)
			}
			if _, ok := d.Spec.Template.Metadata.Labels[key]; ok {
				t.Errorf("the pod template carries the leader label %s itself: every pod would be selected", key)
			}
			if env["POD_NAMESPACE"] != "metadata.namespace" {
				t.Errorf("POD_NAMESPACE from %q: --leader-label needs it from the downward API's metadata.namespace", env["POD_NAMESPACE"])
			}

			host, port, ok := strings.Cut(flags["http"], ":")
			if !ok || host != "0.0.0.0" {
				t.Errorf("--http=%s: want 0.0.0.0:PORT: the kubelet probes the pod's IP, and a port alone is loopback", flags["http"])
			}
			if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/v1/health/leader?standbyok=true" {
				t.Fatal("no readiness probe on /v1/health/leader?standbyok=true: a healthy standby must be Ready too")
			}
			probePort := fmt.Sprint(c.ReadinessProbe.HTTPGet.Port)
			found := false
			for _, p := range c.Ports {
				if p.Name == probePort || fmt.Sprint(p.ContainerPort) == probePort {
					found = true
					if fmt.Sprint(p.ContainerPort) != port {
						t.Errorf("the readiness probe's port %s is %d, but baton serves --http on %s", probePort, p.ContainerPort, port)
					}
				}
			}
			if !found {
				t.Errorf("the readiness probe's port %s is none of the container's ports", probePort)
			}
			for _, c := range all {
				if c.LivenessProbe != nil && strings.Contains(fmt.Sprint(c.LivenessProbe), "/v1/health/leader") {
					t.Errorf("container %s: a liveness probe on /v1/health/leader restarts every standby", c.Name)
				}
			}

			grace, err := time.ParseDuration(flags["grace"])
			if err != nil {
				t.Fatalf("--grace=%q: %v (spell it out: terminationGracePeriodSeconds is matched to it)", flags["grace"], err)
			}
			if pod.TerminationGracePeriodSeconds == nil {
				t.Fatal("no terminationGracePeriodSeconds")
			}
			need := grace + shutdownBudget
			if tgp := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second; tgp <= need {
				t.Errorf("terminationGracePeriodSeconds %d: baton may need --grace %s + %s to stop its command, release the lease and exit; the kubelet's SIGKILL would cut the release short", *pod.TerminationGracePeriodSeconds, grace, shutdownBudget)
			}
			if _, err := time.ParseDuration(flags["ttl"]); err != nil {
				t.Errorf("--ttl=%q: %v", flags["ttl"], err)
			}

			// The Service's target port is the program's.
			for _, sp := range s.Spec.Ports {
				tp := fmt.Sprint(sp.TargetPort)
				if !slices.ContainsFunc(all, func(c container) bool {
					return slices.ContainsFunc(c.Ports, func(p containerPort) bool {
						return p.Name == tp || fmt.Sprint(p.ContainerPort) == tp
					})
				}) {
					t.Errorf("the leader Service's targetPort %s is no container's port", tp)
				}
			}
		})
	}
}

// checkSecurity checks c's effective security context, pod's filling in
// what c leaves out, as Kubernetes does.
func checkSecurity(t *testing.T, c container, pod securityContext) {
	t.Helper()
	sc := c.SecurityContext
	isTrue := func(b *bool) bool { return b != nil && *b }
	isFalse := func(b *bool) bool { return b != nil && !*b }
	if !isTrue(sc.RunAsNonRoot) && !(sc.RunAsNonRoot == nil && isTrue(pod.RunAsNonRoot)) {
		t.Errorf("container %s: runAsNonRoot is not true", c.Name)
	}
	if !isFalse(sc.AllowPrivilegeEscalation) {
		t.Errorf("container %s: allowPrivilegeEscalation is not false", c.Name)
	}
	if !isTrue(sc.ReadOnlyRootFilesystem) {
		t.Errorf("container %s: readOnlyRootFilesystem is not true", c.Name)
	}
	if isTrue(sc.Privileged) {
		t.Errorf("container %s: privileged", c.Name)
	}
	if !slices.Equal(sc.Capabilities.Drop, []string{"ALL"}) || len(sc.Capabilities.Add) != 0 {
		t.Errorf("container %s: capabilities %+v, want drop [ALL] and no add", c.Name, sc.Capabilities)
	}
	if sc.SeccompProfile.Type == "" && pod.SeccompProfile.Type != "RuntimeDefault" {
		t.Errorf("container %s: no seccomp profile (want RuntimeDefault)", c.Name)
	}
}

// releaseImage is the repository baton's release image is published to:
// tools/release's OCI image, /usr/local/bin/baton and CA certificates
// alone, run as user 65532 (docs/install.md).
const releaseImage = "ghcr.io/batonhq/baton"

// TestReleaseImage checks that the sidecar runs baton's release image and
// nothing in it but baton: the container names releaseImage at the
// placeholder tag VERSION, its kustomization.yaml sets that tag in one
// images: entry, and the command baton run starts for the term is baton
// itself (the image has no shell and no sleep; TestDeploymentRunsBaton
// runs it with baton alone on the PATH). No file names another baton
// image.
func TestReleaseImage(t *testing.T) {
	for _, m := range loadManifests(t) {
		if m.kind() != "Deployment" || filepath.Dir(m.file) != "sidecar" {
			continue
		}
		var d deployment
		m.decode(t, &d)
		c := batonContainer(d)
		if want := releaseImage + ":VERSION"; c.Image != want {
			t.Errorf("%s: the baton sidecar's image is %q, want the release image %q", m, c.Image, want)
		}
		program := c.Args[slices.Index(c.Args, "--")+1:]
		if !slices.Equal(program, []string{"baton", "idle"}) {
			t.Errorf("%s: the sidecar's command is %q, want baton idle: the release image holds baton alone", m, program)
		}
		k := loadKustomization(t, "sidecar")
		found := false
		for _, im := range k.Images {
			if im.Name == releaseImage {
				found = true
				if im.NewName != "" || (im.NewTag == "") == (im.Digest == "") {
					t.Errorf("sidecar/kustomization.yaml: images entry %+v: want a newTag (or a digest) for %s, and no newName", im, releaseImage)
				}
			}
		}
		if !found {
			t.Errorf("sidecar/kustomization.yaml: no images: entry for %s, where users set the release", releaseImage)
		}
	}
	for _, f := range yamlFiles(t) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			_, image, ok := strings.Cut(line, "image: ")
			if ok && strings.Contains(image, "baton") && !strings.HasPrefix(image, releaseImage+":") {
				t.Errorf("%s: %q: a baton image other than the release image %s", f, strings.TrimSpace(line), releaseImage)
			}
		}
	}
}
