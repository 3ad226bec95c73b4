package k8s

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
)

// nodeHealthAnswer asks the node health check at path: the status code and nodeEligible (nil:
// not in the body).
func nodeHealthAnswer(port int32, path string) (int, *bool) {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	var body struct {
		LastUpdated  time.Time `json:"lastUpdated"`
		CurrentTime  time.Time `json:"currentTime"`
		NodeEligible *bool     `json:"nodeEligible"`
	}
	if json.NewDecoder(resp.Body).Decode(&body) != nil || body.CurrentTime.IsZero() {
		return -resp.StatusCode, nil
	}
	return resp.StatusCode, body.NodeEligible
}

// kube-proxy's node health check, in place of kube-proxy: /healthz and /livez 200 while the
// agent keeps up; /healthz 503 (nodeEligible false) while the node is tainted for deletion by
// the autoscaler or being deleted, /livez still 200; both 503 once syncs fail past the timeout;
// other paths 404.
func TestNodeHealth(t *testing.T) {
	ctx := context.Background()
	port := freePort(t)
	self := node("self", []string{"10.244.0.0/24"}, "172.18.0.2")
	c := fake.NewClientset(self)
	s := startSource(t, c, Options{NodeHealthAddress: fmt.Sprintf("127.0.0.1:%d", port), ProxyHealthTimeout: 300 * time.Millisecond})
	s.Synced(nil, nil)
	eventually(t, "/healthz 200, eligible", func() bool {
		code, eligible := nodeHealthAnswer(port, "/healthz")
		return code == http.StatusOK && eligible != nil && *eligible
	})
	if code, eligible := nodeHealthAnswer(port, "/livez"); code != http.StatusOK || eligible != nil {
		t.Errorf("/livez: %d, nodeEligible %v; want 200 without it", code, eligible)
	}
	if resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/other", port)); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("/other: %v %v, want 404", resp, err)
	} else {
		resp.Body.Close()
	}

	tainted := self.DeepCopy()
	tainted.Spec.Taints = []corev1.Taint{{Key: ToBeDeletedTaint, Effect: corev1.TaintEffectNoSchedule}}
	if _, err := c.CoreV1().Nodes().Update(ctx, tainted, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "/healthz 503, not eligible, while tainted", func() bool {
		code, eligible := nodeHealthAnswer(port, "/healthz")
		return code == http.StatusServiceUnavailable && eligible != nil && !*eligible
	})
	if code, _ := nodeHealthAnswer(port, "/livez"); code != http.StatusOK {
		t.Errorf("/livez while tainted: %d, want 200", code)
	}
	if _, err := c.CoreV1().Nodes().Update(ctx, self, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "/healthz 200 once the taint is gone", func() bool { code, _ := nodeHealthAnswer(port, "/healthz"); return code == http.StatusOK })

	s.Synced(nil, fmt.Errorf("a failed sync"))
	time.Sleep(400 * time.Millisecond) // > ProxyHealthTimeout
	for _, path := range []string{"/healthz", "/livez"} {
		if code, _ := nodeHealthAnswer(port, path); code != http.StatusServiceUnavailable {
			t.Errorf("%s after failing syncs: %d, want 503", path, code)
		}
	}
}

// A node being deleted (its deletion timestamp set) is not eligible; one the cache does not
// hold yet is, one it no longer holds is not.
func TestNodeHealthEligible(t *testing.T) {
	now := metav1.Now()
	for _, c := range []struct {
		what string
		node *corev1.Node
		err  error
		want bool
	}{
		{"a node", node("self", nil, "172.18.0.2"), nil, true},
		{"being deleted", &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "self", DeletionTimestamp: &now}}, nil, false},
		{"another taint", &corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "node.kubernetes.io/unschedulable"}}}}, nil, true},
		{"gone", nil, errNotFound(), false},
		{"not listed yet", nil, fmt.Errorf("the cache is not synced"), true},
	} {
		h := &nodeHealth{node: func() (*corev1.Node, error) { return c.node, c.err }}
		if got := h.eligible(); got != c.want {
			t.Errorf("%s: eligible %v, want %v", c.what, got, c.want)
		}
	}
}

func errNotFound() error {
	return apierrors.NewNotFound(schema.GroupResource{Resource: "nodes"}, "self")
}
