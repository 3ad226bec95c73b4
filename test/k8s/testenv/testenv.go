// Package testenv runs a real etcd and kube-apiserver on loopback for hostaccel's Kubernetes
// tests and demo: generated certificates, a static admin token, ServiceAccount token signing
// (so that tokens for a ServiceAccount can be minted with the TokenRequest API), RBAC
// authorization. No controller-manager and no kubelet: tests create Nodes, Services and
// EndpointSlices themselves.
//
// The binaries come from scripts/k8s-build-test-bins.sh (built from the Go module proxy, cached
// per machine); BinDir finds them.
package testenv

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Versions the build script produces by default.
const (
	K8sVersion  = "1.37.1"
	EtcdVersion = "3.7.3"
)

// Names of the environment variables the tests read.
const (
	// EnvBinDir names a directory holding kube-apiserver, etcd and kubectl.
	EnvBinDir = "HOSTACCEL_K8S_BIN"
	// EnvRequire=1 makes a missing binary a test failure instead of a skip (CI).
	EnvRequire = "HOSTACCEL_REQUIRE_K8S"
)

// ServiceCIDR is the apiserver's --service-cluster-ip-range.
const ServiceCIDR = "10.96.0.0/16"

// BinDir returns the directory with kube-apiserver, etcd and kubectl: $HOSTACCEL_K8S_BIN, else
// the build script's cache directory for the default versions.
func BinDir() (string, error) {
	dir := os.Getenv(EnvBinDir)
	if dir == "" {
		cache := os.Getenv("HOSTACCEL_K8S_CACHE")
		if cache == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				return "", err
			}
			cache = filepath.Join(home, ".cache", "hostaccel-k8s")
		}
		dir = filepath.Join(cache, "k8s-v"+K8sVersion+"-etcd-v"+EtcdVersion)
	}
	for _, b := range []string{"kube-apiserver", "etcd", "kubectl"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("%s not found in %s (run scripts/k8s-build-test-bins.sh, or set %s)", b, dir, EnvBinDir)
		}
	}
	return dir, nil
}

// Env is one running etcd + kube-apiserver pair.
type Env struct {
	Dir        string // certificates, data, logs, kubeconfig
	BinDir     string
	Host       string // https://127.0.0.1:PORT
	AdminToken string
	CAFile     string
	// Kubeconfig is an admin kubeconfig (system:masters) for kubectl.
	Kubeconfig string

	apiPort, etcdPort, etcdPeerPort int

	mu        sync.Mutex
	etcd      *exec.Cmd
	apiserver *exec.Cmd
}

// Start starts etcd and kube-apiserver with their state under dir (created if needed) and
// waits until the apiserver is ready.
func Start(ctx context.Context, binDir, dir string) (*Env, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	e := &Env{Dir: dir, BinDir: binDir, CAFile: filepath.Join(dir, "ca.crt"), Kubeconfig: filepath.Join(dir, "kubeconfig")}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	e.apiPort, e.etcdPort, e.etcdPeerPort = ports[0], ports[1], ports[2]
	e.Host = "https://127.0.0.1:" + strconv.Itoa(e.apiPort)
	if err := e.writeCredentials(); err != nil {
		return nil, err
	}
	if err := e.WriteKubeconfig(e.Kubeconfig, e.AdminToken); err != nil {
		return nil, err
	}
	if err := e.startEtcd(ctx); err != nil {
		e.Stop()
		return nil, err
	}
	if err := e.StartAPIServer(ctx); err != nil {
		e.Stop()
		return nil, err
	}
	return e, nil
}

func (e *Env) path(name string) string { return filepath.Join(e.Dir, name) }

// writeCredentials generates a CA, the apiserver's serving certificate, the ServiceAccount
// signing key and the static admin token.
func (e *Env) writeCredentials() error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "hostaccel-test-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, _ := x509.ParseCertificate(caDER)
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, net.IPv4(10, 96, 0, 1)},
		DNSNames:     []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return err
	}
	e.AdminToken = hex.EncodeToString(tok)

	srvKeyDER, _ := x509.MarshalECPrivateKey(srvKey)
	saPub, _ := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	files := map[string][]byte{
		"ca.crt":        pemBlock("CERTIFICATE", caDER),
		"apiserver.crt": pemBlock("CERTIFICATE", srvDER),
		"apiserver.key": pemBlock("EC PRIVATE KEY", srvKeyDER),
		"sa.key":        pemBlock("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(saKey)),
		"sa.pub":        pemBlock("PUBLIC KEY", saPub),
		// token,user,uid,"group1,group2"
		"tokens.csv": []byte(e.AdminToken + ",admin,admin,system:masters\n"),
	}
	for name, b := range files {
		if err := os.WriteFile(e.path(name), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func (e *Env) startEtcd(ctx context.Context) error {
	client := "http://127.0.0.1:" + strconv.Itoa(e.etcdPort)
	peer := "http://127.0.0.1:" + strconv.Itoa(e.etcdPeerPort)
	return e.startAndWait(ctx, &e.etcd, "etcd", client+"/health", nil, 30*time.Second,
		"--name=hostaccel-test",
		"--data-dir="+e.path("etcd"),
		"--unsafe-no-fsync",
		"--listen-client-urls="+client, "--advertise-client-urls="+client,
		"--listen-peer-urls="+peer, "--initial-advertise-peer-urls="+peer,
		"--initial-cluster=hostaccel-test="+peer,
		"--log-level=warn",
	)
}

// startAndWait spawns name with args, records it in *slot and waits until url answers.
func (e *Env) startAndWait(ctx context.Context, slot **exec.Cmd, name, url string, hdr http.Header, timeout time.Duration, args ...string) error {
	cmd, err := e.spawn(name, args...)
	if err != nil {
		return err
	}
	e.mu.Lock()
	*slot = cmd
	e.mu.Unlock()
	return e.waitHTTP(ctx, cmd, name, url, hdr, timeout)
}

// StartAPIServer starts kube-apiserver (again, after StopAPIServer) on the same address with the
// same credentials and data, and waits for /readyz.
func (e *Env) StartAPIServer(ctx context.Context) error {
	e.mu.Lock()
	running := e.apiserver != nil
	e.mu.Unlock()
	if running {
		return errors.New("kube-apiserver already running")
	}
	hdr := http.Header{"Authorization": {"Bearer " + e.AdminToken}}
	return e.startAndWait(ctx, &e.apiserver, "kube-apiserver", e.Host+"/readyz", hdr, 90*time.Second,
		"--etcd-servers=http://127.0.0.1:"+strconv.Itoa(e.etcdPort),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		// A loopback advertise address is refused by the endpoint reconciler.
		"--endpoint-reconciler-type=none",
		"--secure-port="+strconv.Itoa(e.apiPort),
		"--tls-cert-file="+e.path("apiserver.crt"),
		"--tls-private-key-file="+e.path("apiserver.key"),
		"--client-ca-file="+e.CAFile,
		"--token-auth-file="+e.path("tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+e.path("sa.pub"),
		"--service-account-signing-key-file="+e.path("sa.key"),
		"--service-cluster-ip-range="+ServiceCIDR,
		"--service-node-port-range=30000-32767",
		"--allow-privileged=true",
		"--profiling=false",
	)
}

// StopAPIServer stops kube-apiserver gracefully (SIGTERM, then SIGKILL after 10s) and leaves
// etcd running.
func (e *Env) StopAPIServer() {
	e.mu.Lock()
	cmd := e.apiserver
	e.apiserver = nil
	e.mu.Unlock()
	stop(cmd)
}

// KillAPIServer kills kube-apiserver (SIGKILL: a crash, or a node cut off from it) and leaves
// etcd running.
func (e *Env) KillAPIServer() {
	e.mu.Lock()
	cmd := e.apiserver
	e.apiserver = nil
	e.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
}

// Stop stops both servers; the state directory stays (tests use t.TempDir).
func (e *Env) Stop() {
	e.StopAPIServer()
	e.mu.Lock()
	cmd := e.etcd
	e.etcd = nil
	e.mu.Unlock()
	stop(cmd)
}

func stop(cmd *exec.Cmd) {
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// spawn starts a binary from BinDir with its output appended to DIR/NAME.log. The child dies
// with its parent (Pdeathsig), so a crashed test leaves no servers behind.
func (e *Env) spawn(name string, args ...string) (*exec.Cmd, error) {
	log, err := os.OpenFile(e.path(name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer log.Close() // the child has its own copy
	cmd := exec.Command(filepath.Join(e.BinDir, name), args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return cmd, nil
}

// waitHTTP polls url until it answers 200, the process exits or the timeout passes.
func (e *Env) waitHTTP(ctx context.Context, cmd *exec.Cmd, name, url string, hdr http.Header, timeout time.Duration) error {
	pool := x509.NewCertPool()
	if ca, err := os.ReadFile(e.CAFile); err == nil {
		pool.AppendCertsFromPEM(ca)
	}
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	exited, done := make(chan struct{}), make(chan struct{})
	defer close(done)
	go func() {
		// Poll for exit without Wait (stop owns Wait): an exited child is a zombie until then.
		for {
			if !alive(cmd.Process.Pid) {
				close(exited)
				return
			}
			select {
			case <-done:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	deadline := time.Now().Add(timeout)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		for k, v := range hdr {
			req.Header[k] = v
		}
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-exited:
			return fmt.Errorf("%s exited during start-up; log:\n%s", name, e.logTail(name))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s; log:\n%s", name, timeout, e.logTail(name))
		}
	}
}

func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) S ...: the state follows the last ')'.
	if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
		return b[i+2] != 'Z' && b[i+2] != 'X'
	}
	return true
}

func (e *Env) logTail(name string) string {
	b, _ := os.ReadFile(e.path(name + ".log"))
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	if len(lines) > 25 {
		lines = lines[len(lines)-25:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// Config returns a client config that authenticates with token.
func (e *Env) Config(token string) *rest.Config {
	return &rest.Config{
		Host:            e.Host,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: e.CAFile},
		QPS:             100,
		Burst:           200,
	}
}

// AdminConfig is Config(AdminToken): system:masters.
func (e *Env) AdminConfig() *rest.Config { return e.Config(e.AdminToken) }

// AdminClient is a clientset for AdminConfig.
func (e *Env) AdminClient() (kubernetes.Interface, error) {
	return kubernetes.NewForConfig(e.AdminConfig())
}

// WriteKubeconfig writes a kubeconfig for this apiserver that authenticates with token.
func (e *Env) WriteKubeconfig(path, token string) error {
	return e.WriteKubeconfigAt(path, e.Host, token)
}

// WriteKubeconfigAt is WriteKubeconfig with another server address (a relay to this
// apiserver; the certificate names 127.0.0.1 and localhost).
func (e *Env) WriteKubeconfigAt(path, server, token string) error {
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: hostaccel-test
  cluster:
    server: %q
    certificate-authority: %q
users:
- name: user
  user:
    token: %q
contexts:
- name: hostaccel-test
  context: {cluster: hostaccel-test, user: user}
current-context: hostaccel-test
`, server, e.CAFile, token)
	return os.WriteFile(path, []byte(kc), 0o600)
}

// ServiceAccountToken mints a token for namespace/name with the TokenRequest API (the way the
// kubelet's projected volume does for a Pod).
func (e *Env) ServiceAccountToken(ctx context.Context, namespace, name string, ttl time.Duration) (string, error) {
	c, err := e.AdminClient()
	if err != nil {
		return "", err
	}
	secs := int64(ttl / time.Second)
	tr, err := c.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs}}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return tr.Status.Token, nil
}

// Kubectl runs kubectl as admin and returns its combined output.
func (e *Env) Kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(e.BinDir, "kubectl"), append([]string{"--kubeconfig", e.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %v: %w\n%s", args, err, out)
	}
	return string(out), nil
}

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for len(ports) < n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Relay forwards every connection accepted on l to addr (the API server on the host's
// loopback, for an agent in a network namespace of its own: TLS passes through, the
// certificate names 127.0.0.1). It returns when l is closed.
func Relay(l net.Listener, addr string) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			u, err := net.Dial("tcp", addr)
			if err != nil {
				return
			}
			defer u.Close()
			done := make(chan struct{}, 2)
			cp := func(dst, src net.Conn) {
				_, _ = io.Copy(dst, src)
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
				done <- struct{}{}
			}
			go cp(u, c)
			go cp(c, u)
			<-done
			<-done
		}()
	}
}
