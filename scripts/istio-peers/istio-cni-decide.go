// istio-cni-decide: feeds pods, one JSON request per stdin line, through
// istio-cni's own sidecar ADD path (plugin.doAddRun: namespace exclusion, the
// meshed-pod tests, NewRedirect, then the real iptables rule manager in
// dry-run mode inside the given network namespace) and prints one JSON answer
// per line. Built by scripts/build-peers.sh in a wrapper module; doAddRun is
// unexported, so it is reached with go:linkname (linked with
// -checklinkname=0); no Istio source is changed.
//
// What is not Istio's own here: the pod comes from a fake clientset holding
// exactly that pod (istio-cni GETs it from the API server), and the iptables
// dependency is Istio's dry-run stub (DRY_RUN_FILE_PATH), so nothing is applied.
//
// Request:  {"id": 1, "namespace": "ns", "name": "p", "pod": {...v1.Pod...},
//            "netns": "/run/netns/x", "excludeNamespaces": ["kube-system"]}
// Answer:   {"id": 1, "programmed": bool, "error": "" | "...",
//            "log": [{"level": "info", "msg": "..."}...], "dryRun": "<DRY_RUN_FILE_PATH content>"}
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	_ "unsafe" // go:linkname

	"github.com/containernetworking/cni/pkg/skel"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"istio.io/istio/cni/pkg/plugin"
)

// istio-cni's sidecar ADD after the kube client is made (cni/pkg/plugin/plugin.go).
//
//go:linkname doAddRun istio.io/istio/cni/pkg/plugin.doAddRun
func doAddRun(args *skel.CmdArgs, conf *plugin.Config, kClient kubernetes.Interface, rulesMgr plugin.InterceptRuleMgr) error

type request struct {
	ID                int             `json:"id"`
	Namespace         string          `json:"namespace"`
	Name              string          `json:"name"`
	Pod               json.RawMessage `json:"pod"`
	Netns             string          `json:"netns"`
	ExcludeNamespaces []string        `json:"excludeNamespaces"`
}

type logLine struct {
	Level string `json:"level"`
	Msg   string `json:"msg"`
}

type answer struct {
	ID         int       `json:"id"`
	Programmed bool      `json:"programmed"`
	Error      string    `json:"error"`
	Log        []logLine `json:"log"`
	DryRun     string    `json:"dryRun"`
}

type recordingMgr struct {
	inner      plugin.InterceptRuleMgr
	programmed bool
}

func (m *recordingMgr) Program(podName, netns string, r *plugin.Redirect) error {
	m.programmed = true
	return m.inner.Program(podName, netns, r)
}

func main() {
	work, err := os.MkdirTemp("", "istio-cni-decide-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer os.RemoveAll(work)
	realStderr := os.Stderr
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var req request
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			fmt.Fprintf(realStderr, "istio-cni-decide: bad request: %v\n", err)
			os.Exit(1)
		}
		ans := decide(&req, work, realStderr)
		if err := out.Encode(ans); err != nil {
			os.Exit(1)
		}
	}
}

func decide(req *request, work string, realStderr *os.File) answer {
	ans := answer{ID: req.ID}
	pod := &v1.Pod{}
	if err := json.Unmarshal(req.Pod, pod); err != nil {
		ans.Error = "driver: pod does not decode as a v1.Pod: " + err.Error()
		return ans
	}
	dir := filepath.Join(work, fmt.Sprint(req.ID))
	_ = os.MkdirAll(dir, 0o755)
	defer os.RemoveAll(dir)
	dryRun := filepath.Join(dir, "dry-run")
	os.Setenv("DRY_RUN_FILE_PATH", dryRun)
	// doAddRun (re)configures Istio's logger to JSON on "stderr" each call:
	// point stderr at a file for this pod and read its lines back.
	logPath := filepath.Join(dir, "log")
	logFile, err := os.Create(logPath)
	if err != nil {
		ans.Error = "driver: " + err.Error()
		return ans
	}
	os.Stderr = logFile
	conf := &plugin.Config{CNIAgentRunDir: dir, ExcludeNamespaces: req.ExcludeNamespaces, PodNamespace: "istio-system"}
	args := &skel.CmdArgs{
		ContainerID: fmt.Sprintf("meshcap-diff-%d", req.ID),
		Netns:       req.Netns,
		IfName:      "eth0",
		Args:        fmt.Sprintf("IgnoreUnknown=1;K8S_POD_NAMESPACE=%s;K8S_POD_NAME=%s", req.Namespace, req.Name),
	}
	client := fake.NewClientset(pod)
	mgr := &recordingMgr{inner: plugin.IptablesInterceptRuleMgr()}
	runErr := doAddRun(args, conf, client, mgr)
	os.Stderr = realStderr
	logFile.Close()
	if runErr != nil {
		ans.Error = runErr.Error()
	}
	ans.Programmed = mgr.programmed
	if b, err := os.ReadFile(logPath); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			var ll logLine
			if json.Unmarshal([]byte(l), &ll) == nil && ll.Msg != "" {
				ans.Log = append(ans.Log, ll)
			}
		}
	}
	if b, err := os.ReadFile(dryRun); err == nil {
		ans.DryRun = string(b)
	}
	return ans
}
