// Package fakeruntime serves the CRI on a unix socket with the upstream fake
// runtime (k8s.io/cri-client/pkg/fake), so a real kubelet can run pods without a
// container engine. On top of the fake it does what containerd does with CDI:
// every CDI device the kubelet passes (from DRA or a device plugin) is resolved
// against the spec files on disk when the container is created, an unresolvable
// name fails the creation, and the resulting container edits are recorded as a
// JSON file per container so tests can see what the container would have got.
package fakeruntime

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"google.golang.org/grpc"
	kubeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
	"sigs.k8s.io/yaml"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// cdiAnnotationPrefix marks container annotations that carry CDI device names
// (the device-plugin annotation strategy).
const cdiAnnotationPrefix = "cdi.k8s.io/"

type deviceNode struct {
	Path     string `json:"path"`
	HostPath string `json:"hostPath,omitempty"`
}

type mount struct {
	HostPath      string   `json:"hostPath"`
	ContainerPath string   `json:"containerPath"`
	Options       []string `json:"options,omitempty"`
}

type hook struct {
	HookName string   `json:"hookName"`
	Path     string   `json:"path"`
	Args     []string `json:"args,omitempty"`
}

// record is what a test reads back: the container as the runtime would start it.
type record struct {
	Namespace   string            `json:"namespace"`
	Pod         string            `json:"pod"`
	Container   string            `json:"container"`
	CDIDevices  []string          `json:"cdiDevices"`
	Env         map[string]string `json:"env"`
	DeviceNodes []deviceNode      `json:"deviceNodes"`
	Mounts      []mount           `json:"mounts"`
	Hooks       []hook            `json:"hooks"`
	Annotations map[string]string `json:"annotations"`
}

type runtime struct {
	*fake.RemoteRuntime
	cdiDirs   []string
	recordDir string
}

// loadSpecs reads every spec file on each call, as the runtime must see files
// that the driver wrote moments ago. Each is decoded strictly into the CDI
// specification's own types (tags.cncf.io/container-device-interface/specs-go, the
// release containerd 2.2 reads specs with) and checked against the cdiVersion it
// declares, as the CDI library does: a field the declared version lacks, or one
// no version has, makes the file invalid.
func (r *runtime) loadSpecs() (map[string][]cdispec.ContainerEdits, error) {
	devices := map[string][]cdispec.ContainerEdits{}
	for _, dir := range r.cdiDirs {
		entries, err := os.ReadDir(dir)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, entry := range entries {
			ext := filepath.Ext(entry.Name())
			if entry.IsDir() || (ext != ".json" && ext != ".yaml" && ext != ".yml") {
				continue
			}
			path := filepath.Join(dir, entry.Name())
			data, err := os.ReadFile(path)
			if os.IsNotExist(err) {
				continue
			}
			if err != nil {
				return nil, err
			}
			var spec cdispec.Spec
			if err := yaml.UnmarshalStrict(data, &spec); err != nil {
				return nil, fmt.Errorf("invalid CDI spec %s: %w", path, err)
			}
			if spec.Version == "" || !strings.Contains(spec.Kind, "/") {
				return nil, fmt.Errorf("invalid CDI spec %s: cdiVersion and kind vendor/class are required", path)
			}
			if err := cdispec.ValidateVersion(&spec); err != nil {
				return nil, fmt.Errorf("invalid CDI spec %s: %w", path, err)
			}
			for _, dev := range spec.Devices {
				name := spec.Kind + "=" + dev.Name
				if _, dup := devices[name]; dup {
					return nil, fmt.Errorf("CDI device %s defined twice (second time in %s)", name, path)
				}
				devices[name] = []cdispec.ContainerEdits{spec.ContainerEdits, dev.ContainerEdits}
			}
		}
	}
	return devices, nil
}

func requestedDevices(config *kubeapi.ContainerConfig) []string {
	var names []string
	for _, dev := range config.GetCDIDevices() {
		names = append(names, dev.GetName())
	}
	keys := make([]string, 0, len(config.GetAnnotations()))
	for key := range config.GetAnnotations() {
		if strings.HasPrefix(key, cdiAnnotationPrefix) {
			keys = append(keys, key)
		}
	}
	sort.Strings(keys)
	for _, key := range keys {
		for _, name := range strings.Split(config.GetAnnotations()[key], ",") {
			if name = strings.TrimSpace(name); name != "" {
				names = append(names, name)
			}
		}
	}
	return names
}

func (r *runtime) CreateContainer(ctx context.Context, req *kubeapi.CreateContainerRequest) (*kubeapi.CreateContainerResponse, error) {
	config := req.GetConfig()
	rec := record{
		Namespace:   req.GetSandboxConfig().GetMetadata().GetNamespace(),
		Pod:         req.GetSandboxConfig().GetMetadata().GetName(),
		Container:   config.GetMetadata().GetName(),
		CDIDevices:  append([]string{}, requestedDevices(config)...),
		Env:         map[string]string{},
		DeviceNodes: []deviceNode{},
		Mounts:      []mount{},
		Hooks:       []hook{},
		Annotations: config.GetAnnotations(),
	}
	for _, kv := range config.GetEnvs() {
		rec.Env[kv.GetKey()] = string(kv.GetValue())
	}
	if len(rec.CDIDevices) > 0 {
		specs, err := r.loadSpecs()
		if err != nil {
			return nil, fmt.Errorf("CDI device injection failed: %w", err)
		}
		var missing []string
		for _, name := range rec.CDIDevices {
			edits, ok := specs[name]
			if !ok {
				missing = append(missing, name)
				continue
			}
			for _, e := range edits {
				for _, kv := range e.Env {
					key, value, _ := strings.Cut(kv, "=")
					rec.Env[key] = value
				}
				for _, node := range e.DeviceNodes {
					rec.DeviceNodes = append(rec.DeviceNodes, deviceNode{Path: node.Path, HostPath: node.HostPath})
				}
				for _, m := range e.Mounts {
					rec.Mounts = append(rec.Mounts, mount{HostPath: m.HostPath, ContainerPath: m.ContainerPath, Options: m.Options})
				}
				for _, h := range e.Hooks {
					rec.Hooks = append(rec.Hooks, hook{HookName: h.HookName, Path: h.Path, Args: h.Args})
				}
			}
		}
		if len(missing) > 0 {
			return nil, fmt.Errorf("CDI device injection failed: unresolvable CDI devices %s", strings.Join(missing, ", "))
		}
	}
	if err := r.writeRecord(rec); err != nil {
		return nil, err
	}
	return r.RemoteRuntime.CreateContainer(ctx, req)
}

func (r *runtime) writeRecord(rec record) error {
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	name := fmt.Sprintf("%s_%s_%s.json", rec.Namespace, rec.Pod, rec.Container)
	tmp := filepath.Join(r.recordDir, "."+name+".tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(r.recordDir, name))
}

// Main runs the fake runtime with the flags in os.Args[1:] until SIGTERM or SIGINT; the
// hyperkube command calls it as "fakeruntime". Its own flag set keeps out the flags other
// packages of that binary register on the global one.
func Main() int {
	flags := flag.NewFlagSet("fakeruntime", flag.ExitOnError)
	listen := flags.String("listen", "", "unix socket path to serve the CRI on (required)")
	cdiDirs := flags.String("cdi-dirs", "/etc/cdi,/var/run/cdi", "comma-separated CDI spec directories")
	recordDir := flags.String("record-dir", "", "directory for per-container records (required)")
	imageSize := flags.Uint64("image-size", 1<<20, "size reported for every image; the kubelet rejects size 0")
	_ = flags.Parse(os.Args[1:])
	if *listen == "" || *recordDir == "" {
		log.Fatal("--listen and --record-dir are required")
	}
	if err := os.MkdirAll(*recordDir, 0o755); err != nil {
		log.Fatal(err)
	}

	fakeRuntime := fake.NewFakeRemoteRuntime()
	fakeRuntime.ImageService.SetFakeImageSize(*imageSize)
	fakeRuntime.RuntimeService.FakeStatus = &kubeapi.RuntimeStatus{
		Conditions: []*kubeapi.RuntimeCondition{
			{Type: kubeapi.RuntimeReady, Status: true},
			{Type: kubeapi.NetworkReady, Status: true},
		},
	}
	fakeRuntime.RuntimeService.FakeLinuxConfiguration = &kubeapi.LinuxRuntimeConfiguration{
		CgroupDriver: kubeapi.CgroupDriver_CGROUPFS,
	}
	r := &runtime{RemoteRuntime: fakeRuntime, cdiDirs: strings.Split(*cdiDirs, ","), recordDir: *recordDir}

	_ = os.Remove(*listen)
	listener, err := net.Listen("unix", *listen)
	if err != nil {
		log.Fatalf("listening on %s: %v", *listen, err)
	}
	server := grpc.NewServer()
	kubeapi.RegisterRuntimeServiceServer(server, r)
	kubeapi.RegisterImageServiceServer(server, r)

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		server.Stop()
	}()
	log.Printf("fake CRI runtime serving on %s", *listen)
	if err := server.Serve(listener); err != nil {
		log.Fatal(err)
	}
	return 0
}
