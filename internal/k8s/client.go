package k8s

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// RestConfig returns the client config: the kubeconfig file when one is given (or $KUBECONFIG
// is set outside a cluster), else the Pod's in-cluster config (its ServiceAccount token).
func RestConfig(kubeconfig string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	switch {
	case kubeconfig != "":
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	default:
		cfg, err = rest.InClusterConfig()
		if errors.Is(err, rest.ErrNotInCluster) && os.Getenv("KUBECONFIG") != "" {
			cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
				clientcmd.NewDefaultClientConfigLoadingRules(), &clientcmd.ConfigOverrides{}).ClientConfig()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w (give --kubeconfig, or run in a Pod)", err)
	}
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "hostaccel-agent"
	// Protobuf is cheaper than JSON for the informers' lists and watches.
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	return cfg, nil
}

// NewClient is kubernetes.NewForConfig(RestConfig(kubeconfig)).
func NewClient(kubeconfig string) (kubernetes.Interface, *rest.Config, error) {
	cfg, err := RestConfig(kubeconfig)
	if err != nil {
		return nil, nil, err
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	return c, cfg, nil
}

// EnvNodeName is the variable the DaemonSet sets from the downward API (spec.nodeName).
const EnvNodeName = "NODE_NAME"

// NodeName picks this node's name: the flag, else $NODE_NAME, else the host name (the
// kubelet's default node name, lower-cased).
func NodeName(flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if n := os.Getenv(EnvNodeName); n != "" {
		return n, nil
	}
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("node name: give --node-name or set %s: %w", EnvNodeName, err)
	}
	return strings.ToLower(h), nil
}
