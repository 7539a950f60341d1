package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// config is the driver's settings (the flags in main.go).
type config struct {
	DriverName      string
	NodeID          string
	CSISocket       string // absolute path of the CSI socket
	RegistrationDir string // the kubelet's plugins_registry; "" = do not register
	DataDir         string // volumes/<id>, snapshots/<id> and their .json records
	TopologyKey     string // "" = no topology
	TopologyValue   string
	Capacity        int64 // total bytes volumes may claim; 0 = unlimited
}

// driver is the state the CSI services share. Everything that must survive a restart is on
// disk under DataDir, so a restarted driver carries on where the last one stopped.
type driver struct {
	cfg config

	// controllerMu serialises the controller calls: each one reads and writes several files
	// (a record and a tree), and the sidecars retry, so two calls for one name can overlap.
	controllerMu sync.Mutex
	// nodeMu serialises the node calls, so "is it mounted? then mount" is not raced.
	nodeMu sync.Mutex

	// onRegistrationFailed is called (on its own goroutine) when the kubelet reports that
	// it refused the registration; main exits.
	onRegistrationFailed func(error)
}

func newDriver(cfg config) *driver { return &driver{cfg: cfg} }

// servers are the running gRPC servers: CSI (identity, controller, node) and registration.
type servers struct {
	csi, reg             *grpc.Server
	csiSocket, regSocket string
	errs                 chan error // a server that stopped on its own
	once                 sync.Once
}

// start creates the data directories and serves the CSI socket, then the registration
// socket: the kubelet dials the CSI socket as soon as it has read the registration answer.
func start(d *driver) (*servers, error) {
	for _, dir := range []string{"volumes", "snapshots", "tmp"} {
		if err := os.MkdirAll(filepath.Join(d.cfg.DataDir, dir), 0o755); err != nil {
			return nil, err
		}
	}
	s := &servers{csiSocket: d.cfg.CSISocket, errs: make(chan error, 2)}

	lis, err := listenUnix(s.csiSocket)
	if err != nil {
		return nil, err
	}
	s.csi = grpc.NewServer(grpc.UnaryInterceptor(logCalls))
	csi.RegisterIdentityServer(s.csi, &identity{driver: d})
	csi.RegisterControllerServer(s.csi, &controller{driver: d})
	csi.RegisterNodeServer(s.csi, &node{driver: d})
	csi.RegisterSnapshotMetadataServer(s.csi, &snapshotMetadata{driver: d})
	go s.serve(s.csi, lis)

	if d.cfg.RegistrationDir != "" {
		// The kubelet's plugin watcher treats any socket in plugins_registry as a plugin;
		// this name is node-driver-registrar's convention.
		s.regSocket = filepath.Join(d.cfg.RegistrationDir, d.cfg.DriverName+"-reg.sock")
		lis, err := listenUnix(s.regSocket)
		if err != nil {
			s.stop()
			return nil, err
		}
		s.reg = grpc.NewServer(grpc.UnaryInterceptor(logCalls))
		registerapi.RegisterRegistrationServer(s.reg, &registration{driver: d})
		go s.serve(s.reg, lis)
	}
	return s, nil
}

func (s *servers) serve(srv *grpc.Server, lis net.Listener) {
	// Serve returns nil only after Stop.
	if err := srv.Serve(lis); err != nil {
		s.errs <- err
	}
}

// stop deregisters first (the kubelet forgets a plugin whose socket is removed), then stops
// the CSI server and removes both sockets, so a restarted driver is not refused as a
// duplicate.
func (s *servers) stop() {
	s.once.Do(func() {
		if s.reg != nil {
			stopSoon(s.reg)
			removeSocket(s.regSocket)
		}
		stopSoon(s.csi)
		removeSocket(s.csiSocket)
	})
}

// stopSoon lets calls in progress send their answers (the kubelet's NotifyRegistrationStatus
// among them), but waits no more than two seconds: a snapshot copy cut short leaves only
// a tmp/ directory, which the next call for that name removes.
func stopSoon(srv *grpc.Server) {
	done := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		srv.Stop()
	}
}

// listenUnix listens on a unix socket at path, creating its directory and removing a stale
// socket a killed driver left behind (listen fails with EADDRINUSE on one).
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&fs.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket; not removing it", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	return net.Listen("unix", path)
}

func removeSocket(path string) {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		log.Printf("removing %s: %v", path, err)
	}
}

// logCalls logs every gRPC call on one line: method, request, and the error or the answer.
func logCalls(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	t0 := time.Now()
	resp, err := handler(ctx, req)
	took := time.Since(t0).Round(time.Microsecond)
	if err != nil {
		log.Printf("%s {%s} -> error: %v (%s)", info.FullMethod, brief(req), err, took)
	} else {
		log.Printf("%s {%s} -> ok {%s} (%s)", info.FullMethod, brief(req), brief(resp), took)
	}
	return resp, err
}

// brief is a message in protobuf text form, on one line and cut short.
func brief(m any) string {
	s := strings.Join(strings.Fields(fmt.Sprint(m)), " ")
	if len(s) > 400 {
		s = s[:400] + "..."
	}
	return s
}

// identity is the CSI Identity service.
type identity struct {
	csi.UnimplementedIdentityServer
	*driver
}

func (i *identity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: i.cfg.DriverName, VendorVersion: version}, nil
}

func (i *identity) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	service := func(t csi.PluginCapability_Service_Type) *csi.PluginCapability {
		return &csi.PluginCapability{Type: &csi.PluginCapability_Service_{
			Service: &csi.PluginCapability_Service{Type: t}}}
	}
	caps := []*csi.PluginCapability{service(csi.PluginCapability_Service_CONTROLLER_SERVICE),
		service(csi.PluginCapability_Service_SNAPSHOT_METADATA_SERVICE)}
	if i.cfg.TopologyKey != "" {
		caps = append(caps, service(csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS))
	}
	return &csi.GetPluginCapabilitiesResponse{Capabilities: caps}, nil
}

// Probe is ready when the data directory is there (it may live on a mount that went away).
func (i *identity) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	if _, err := os.Stat(filepath.Join(i.cfg.DataDir, "volumes")); err != nil {
		return &csi.ProbeResponse{Ready: wrapperspb.Bool(false)}, nil
	}
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}

// topology is where this driver's volumes are accessible: nil without --topology-key.
func (d *driver) topology() []*csi.Topology {
	if d.cfg.TopologyKey == "" {
		return nil
	}
	return []*csi.Topology{{Segments: map[string]string{d.cfg.TopologyKey: d.cfg.TopologyValue}}}
}

// registration is the kubelet's plugin registration service (what node-driver-registrar
// serves for other drivers).
type registration struct {
	registerapi.UnimplementedRegistrationServer
	*driver
}

func (r *registration) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              r.cfg.DriverName,
		Endpoint:          r.cfg.CSISocket,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (r *registration) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if st.GetPluginRegistered() {
		log.Printf("the kubelet registered %s", r.cfg.DriverName)
		return &registerapi.RegistrationStatusResponse{}, nil
	}
	err := fmt.Errorf("the kubelet refused to register %s: %s", r.cfg.DriverName, st.GetError())
	log.Print(err)
	if r.onRegistrationFailed != nil {
		// On its own goroutine: main then stops this server, which must not wait on this call.
		go r.onRegistrationFailed(err)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}
