// Command grpcfloor serves the kubelet's DRA v1 service and does no work: every
// NodePrepareResources is answered at once with one made-up device per claim,
// every NodeUnprepareResources with success. It is the floor a Go driver
// cannot go under (gRPC, protobuf and the Go runtime, nothing else), measured
// beside the same floor in Python by tests/bench/bench_grpcserver.py, so a
// benchmark can tell the runtime's share of a call from a driver's.
//
// Usage: grpcfloor <unix socket path>; it prints "ready" once serving and
// stops when its standard input closes.
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"

	"google.golang.org/grpc"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
)

type floor struct {
	drapb.UnimplementedDRAPluginServer
}

func (floor) NodePrepareResources(_ context.Context, req *drapb.NodePrepareResourcesRequest) (*drapb.NodePrepareResourcesResponse, error) {
	claims := make(map[string]*drapb.NodePrepareResourceResponse, len(req.Claims))
	for _, claim := range req.Claims {
		device := &drapb.Device{PoolName: "floor", DeviceName: "gpu-0", CDIDeviceIDs: []string{"floor.example.com/gpu=" + claim.UID}}
		claims[claim.UID] = &drapb.NodePrepareResourceResponse{Devices: []*drapb.Device{device}}
	}
	return &drapb.NodePrepareResourcesResponse{Claims: claims}, nil
}

func (floor) NodeUnprepareResources(_ context.Context, req *drapb.NodeUnprepareResourcesRequest) (*drapb.NodeUnprepareResourcesResponse, error) {
	claims := make(map[string]*drapb.NodeUnprepareResourceResponse, len(req.Claims))
	for _, claim := range req.Claims {
		claims[claim.UID] = &drapb.NodeUnprepareResourceResponse{}
	}
	return &drapb.NodeUnprepareResourcesResponse{Claims: claims}, nil
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: grpcfloor <unix socket path>")
		os.Exit(2)
	}
	_ = os.Remove(os.Args[1])
	listener, err := net.Listen("unix", os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	server := grpc.NewServer()
	drapb.RegisterDRAPluginServer(server, floor{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		server.Stop()
	}()
	fmt.Println("ready")
	if err := server.Serve(listener); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
