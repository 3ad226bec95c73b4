package k8s_test

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/hostaccel/hostaccel/internal/k8s"
	"github.com/hostaccel/hostaccel/internal/k8s/k8stest"
)

// `kubectl apply --dry-run=server -k` of deploy/, deploy/tc/ and deploy/auto/ is accepted by
// the real API server: every object passes its schema with strict field validation (an unknown or
// misplaced field fails), admission and RBAC's own checks (the ClusterRole's rules). A
// manifest with a misspelled field is refused, so the check can fail.
func TestManifestsServerDryRun(t *testing.T) {
	requireEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, file, _, _ := runtime.Caller(0)
	deploy := filepath.Join(filepath.Dir(file), "..", "..", "deploy")
	// Namespaced objects need their namespace to exist, even in a dry run.
	if _, err := env.Kubectl(ctx, "apply", "-f", filepath.Join(deploy, "base", "namespace.yaml")); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{deploy, filepath.Join(deploy, "tc"), filepath.Join(deploy, "auto")} {
		out, err := env.Kubectl(ctx, "apply", "--dry-run=server", "--validate=strict", "-k", dir)
		if err != nil {
			t.Errorf("%s: %v", dir, err)
			continue
		}
		for _, obj := range []string{"namespace/hostaccel-system", "serviceaccount/hostaccel", "clusterrole.rbac.authorization.k8s.io/hostaccel-agent",
			"clusterrolebinding.rbac.authorization.k8s.io/hostaccel-agent", "configmap/hostaccel-config", "daemonset.apps/hostaccel-agent"} {
			if !strings.Contains(out, obj) {
				t.Errorf("%s: the dry run does not list %s:\n%s", dir, obj, out)
			}
		}
		t.Logf("%s:\n%s", filepath.Base(dir), out)

		// The ConfigMap's config, with what the API adds for a node, is a valid agent config.
		built, err := env.Kubectl(ctx, "kustomize", dir)
		if err != nil {
			t.Fatal(err)
		}
		var cm corev1.ConfigMap
		for _, doc := range strings.Split(built, "\n---\n") {
			if strings.Contains(doc, "kind: ConfigMap") {
				if err := yaml.UnmarshalStrict([]byte(doc), &cm); err != nil {
					t.Fatalf("%s: ConfigMap: %v", dir, err)
				}
			}
		}
		base, err := k8s.ParseBase([]byte(cm.Data["config.yaml"]))
		if err != nil {
			t.Fatalf("%s: config.yaml: %v", dir, err)
		}
		snap := k8s.Snapshot{Nodes: []*corev1.Node{
			k8stest.Node("node-1", []string{"10.244.0.0/24"}, "172.18.0.2"),
			k8stest.Node("node-2", []string{"10.244.1.0/24"}, "172.18.0.3"),
		}}
		d, err := k8s.Derive(base, snap, k8s.Params{NodeName: "node-1"})
		if err != nil {
			t.Errorf("%s: the ConfigMap's config with a node's facts: %v", dir, err)
		} else {
			t.Logf("%s: datapath %s", filepath.Base(dir), d.Config.Datapath)
		}
	}
	// Nothing was created.
	if _, err := admin.AppsV1().DaemonSets("hostaccel-system").Get(ctx, "hostaccel-agent", metav1.GetOptions{}); err == nil {
		t.Log("the DaemonSet exists (applied by another test)")
	} else if !apierrors.IsNotFound(err) {
		t.Error(err)
	}

	// The check can fail: a misspelled field in the container's securityContext.
	bad := t.TempDir()
	base, err := filepath.Rel(bad, filepath.Join(deploy, "base")) // kustomize takes no absolute base
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"kustomization.yaml": "resources:\n- " + base + "\npatches:\n- path: patch.yaml\n",
		"patch.yaml": `apiVersion: apps/v1
kind: DaemonSet
metadata: {name: hostaccel-agent, namespace: hostaccel-system}
spec:
  template:
    spec:
      containers:
      - name: agent
        securityContext: {capabilitiez: {add: [NET_ADMIN]}}
`,
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(bad, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := env.Kubectl(ctx, "apply", "--dry-run=server", "--validate=strict", "-k", bad); err == nil || !strings.Contains(out, "capabilitiez") {
		t.Errorf("a DaemonSet with an unknown field passed the dry run: %v\n%s", err, out)
	}
}
