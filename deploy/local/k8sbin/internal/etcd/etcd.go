// Package etcd runs a single-member etcd server built from the etcd version that
// Kubernetes pins, for the local test cluster. It exists because etcd's own main
// package lives in a module whose dependencies conflict with k8s.io/kubernetes.
package etcd

import (
	"flag"
	"log"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"go.etcd.io/etcd/server/v3/embed"
)

func mustURL(raw string) url.URL {
	u, err := url.Parse(raw)
	if err != nil {
		log.Fatalf("invalid URL %q: %v", raw, err)
	}
	return *u
}

// Main runs the server with the flags in os.Args[1:] until SIGTERM or SIGINT; the hyperkube
// command calls it as "etcd". Its own flag set keeps out the flags other packages of that
// binary register on the global one.
func Main() int {
	flags := flag.NewFlagSet("etcd", flag.ExitOnError)
	dataDir := flags.String("data-dir", "", "directory for etcd data (required)")
	clientURL := flags.String("listen-client-url", "http://127.0.0.1:2379", "client URL to listen on")
	peerURL := flags.String("listen-peer-url", "http://127.0.0.1:2380", "peer URL to listen on")
	_ = flags.Parse(os.Args[1:])
	if *dataDir == "" {
		log.Fatal("--data-dir is required")
	}

	cfg := embed.NewConfig()
	cfg.Dir = *dataDir
	cfg.LogLevel = "error"
	// A throwaway test cluster trades durability for speed: fsync dominates etcd latency on CI disks.
	cfg.UnsafeNoFsync = true
	client, peer := mustURL(*clientURL), mustURL(*peerURL)
	cfg.ListenClientUrls = []url.URL{client}
	cfg.AdvertiseClientUrls = []url.URL{client}
	cfg.ListenPeerUrls = []url.URL{peer}
	cfg.AdvertisePeerUrls = []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)

	server, err := embed.StartEtcd(cfg)
	if err != nil {
		log.Fatalf("starting etcd: %v", err)
	}
	<-server.Server.ReadyNotify()
	log.Printf("etcd ready on %s", client.String())

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-stop:
	case err := <-server.Err():
		log.Printf("etcd failed: %v", err)
	}
	server.Close()
	return 0
}
