// Command hyperkube is every program the local test cluster starts, in one binary that runs
// the one it is called as: the binary cache holds it once and a hard link per command
// (kube-apiserver, kubelet, etcd, ...), or `hyperkube kubelet --flags` runs one by name.
// A first build then compiles and links once instead of once per command: the kube commands share
// most of their packages, and linking each of them separately took minutes of a first
// `make demo` on two cores. Each Kubernetes command runs exactly as its own main package
// in k8s.io/kubernetes/cmd does: the same constructor, cli.Run, and blank imports.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	_ "time/tzdata" // kube-apiserver's and kube-controller-manager's main: CronJob time zones

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // the JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go's metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // the build-info metric
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"

	"github.com/dra-gpu/dra-gpu/tests/k8sbin/internal/etcd"
	"github.com/dra-gpu/dra-gpu/tests/k8sbin/internal/fakeruntime"
)

// commands maps each name the binary answers to to what that command's main does.
var commands = map[string]func() int{
	"kube-apiserver":          func() int { return cli.Run(apiserver.NewAPIServerCommand()) },
	"kube-controller-manager": func() int { return cli.Run(controllermanager.NewControllerManagerCommand()) },
	"kube-scheduler":          func() int { return cli.Run(scheduler.NewSchedulerCommand()) },
	"kube-proxy":              func() int { return cli.Run(proxy.NewProxyCommand()) },
	"kubelet":                 func() int { return cli.Run(kubelet.NewKubeletCommand(context.Background())) },
	"etcd":                    etcd.Main,
	"fakeruntime":             fakeruntime.Main,
}

func main() {
	name := filepath.Base(os.Args[0])
	if _, known := commands[name]; !known && len(os.Args) > 1 {
		// `hyperkube kubelet --flags`: the command reads the arguments after its name.
		name = os.Args[1]
		os.Args = os.Args[1:]
	}
	run, known := commands[name]
	if !known {
		names := make([]string, 0, len(commands))
		for known := range commands {
			names = append(names, known)
		}
		sort.Strings(names)
		fmt.Fprintf(os.Stderr, "hyperkube: unknown command %q; run it as (or with the first argument) one of %v\n", name, names)
		os.Exit(2)
	}
	os.Exit(run())
}
