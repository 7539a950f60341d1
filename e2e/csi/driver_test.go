package main

// These tests run the driver's gRPC servers in-process on unix sockets in a temporary
// directory and call them through real gRPC clients, as the kubelet and the CSI sidecars do.
// The node calls make real bind mounts, so the tests need root.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

type harness struct {
	t         *testing.T
	root      string
	cfg       config
	s         *servers
	ctx       context.Context
	ids       csi.IdentityClient
	ctl       csi.ControllerClient
	node      csi.NodeClient
	meta      csi.SnapshotMetadataClient
	reg       registerapi.RegistrationClient
	regFailed chan error
}

// startDriver starts a driver in a fresh temporary directory; prepare, if not nil, may change
// its config or put files in place first.
func startDriver(t *testing.T, prepare func(*config)) *harness {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipped: ferry-csi's tests need root (they bind-mount and chown); run go test as root")
	}
	root := t.TempDir()
	// Cleanups run last-in first-out, so this runs before TempDir removes root: unmount what
	// a failed test left, so the removal cannot reach through a bind mount.
	t.Cleanup(func() { unmountUnder(t, root) })

	cfg := config{
		DriverName:      "csi.ferry.dev",
		NodeID:          "node-1",
		CSISocket:       filepath.Join(root, "plugins", "csi.ferry.dev", "csi.sock"),
		RegistrationDir: filepath.Join(root, "plugins_registry"),
		DataDir:         filepath.Join(root, "data"),
		TopologyKey:     "topology.csi.ferry.dev/node",
		TopologyValue:   "node-1",
	}
	if prepare != nil {
		prepare(&cfg)
	}
	d := newDriver(cfg)
	h := &harness{t: t, root: root, cfg: cfg, regFailed: make(chan error, 1)}
	// As main does: report it, then stop the servers (the refusal's answer must still get out).
	d.onRegistrationFailed = func(err error) {
		h.regFailed <- err
		h.s.stop()
	}
	s, err := start(d)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	h.s = s
	t.Cleanup(s.stop)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	h.ctx = ctx
	conn := dial(t, cfg.CSISocket)
	h.ids, h.ctl, h.node = csi.NewIdentityClient(conn), csi.NewControllerClient(conn), csi.NewNodeClient(conn)
	h.meta = csi.NewSnapshotMetadataClient(conn)
	h.reg = registerapi.NewRegistrationClient(dial(t, filepath.Join(cfg.RegistrationDir, "csi.ferry.dev-reg.sock")))
	return h
}

func dial(t *testing.T, socket string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial %s: %v", socket, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// unmountUnder detaches every mount under root, deepest first.
func unmountUnder(t *testing.T, root string) {
	mounts, err := readMountinfo()
	if err != nil {
		t.Errorf("reading mountinfo: %v", err)
		return
	}
	var under []string
	for _, m := range mounts {
		if strings.HasPrefix(m.mountPoint, root+"/") {
			under = append(under, m.mountPoint)
		}
	}
	sort.Slice(under, func(i, j int) bool { return len(under[i]) > len(under[j]) })
	for _, p := range under {
		t.Logf("cleanup: unmounting %s, left mounted", p)
		_ = unix.Unmount(p, unix.MNT_DETACH)
	}
}

func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Fatalf("%s: got %v (%v), want code %v", what, got, err, want)
	}
}

func must(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func mountCap(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

var rwo = mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)

func (h *harness) createVolume(name string, size int64, source *csi.VolumeContentSource) *csi.Volume {
	h.t.Helper()
	resp, err := h.ctl.CreateVolume(h.ctx, &csi.CreateVolumeRequest{
		Name:                name,
		CapacityRange:       &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities:  []*csi.VolumeCapability{rwo},
		VolumeContentSource: source,
	})
	must(h.t, "CreateVolume "+name, err)
	return resp.GetVolume()
}

func (h *harness) volumeDir(id string) string   { return filepath.Join(h.cfg.DataDir, "volumes", id) }
func (h *harness) snapshotDir(id string) string { return filepath.Join(h.cfg.DataDir, "snapshots", id) }

// entry is what a faithful copy must keep of a file. Access times are left out: reading a
// file (as the checks do) moves them.
type entry struct {
	Kind     string
	Mode     uint32 // permission bits, set-user-ID, set-group-ID, sticky
	UID, GID uint32
	Mtime    int64
	Size     int64
	Data     string // regular files' contents (the test's files are small)
	Link     string // symlink target
	SameAs   string // a hard link: the first path with the same inode
	Xattrs   map[string]string
}

// describe lists the tree at root: path relative to root -> entry.
func describe(t *testing.T, root string) map[string]entry {
	t.Helper()
	out := map[string]entry{}
	first := map[inode]string{}
	err := filepath.WalkDir(root, func(path string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return err
		}
		e := entry{Mode: st.Mode & 0o7777, UID: st.Uid, GID: st.Gid, Mtime: st.Mtim.Nano()}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			e.Kind = "dir"
		case unix.S_IFREG:
			e.Kind, e.Size = "file", st.Size
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			e.Data = string(b)
			key := inode{uint64(st.Dev), st.Ino}
			if p, ok := first[key]; ok {
				e.SameAs = p
			} else {
				first[key] = rel
			}
		case unix.S_IFLNK:
			e.Kind = "symlink"
			e.Mode = 0 // meaningless on Linux
			if e.Link, err = os.Readlink(path); err != nil {
				return err
			}
		case unix.S_IFIFO:
			e.Kind = "fifo"
		default:
			e.Kind = fmt.Sprintf("type %o", st.Mode&unix.S_IFMT)
		}
		names, err := xattrNames(path)
		if err != nil {
			return err
		}
		for _, n := range names {
			if e.Xattrs == nil {
				e.Xattrs = map[string]string{}
			}
			v, err := xattr(path, n)
			if err != nil {
				return err
			}
			e.Xattrs[n] = string(v)
		}
		out[rel] = e
		return nil
	})
	if err != nil {
		t.Fatalf("describing %s: %v", root, err)
	}
	return out
}

// sameTree fails the test with every difference between two descriptions.
func sameTree(t *testing.T, what string, got, want map[string]entry) {
	t.Helper()
	var diffs []string
	for p, w := range want {
		g, ok := got[p]
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("  %s: missing, want %+v", p, w))
		case fmt.Sprintf("%+v", g) != fmt.Sprintf("%+v", w):
			diffs = append(diffs, fmt.Sprintf("  %s:\n    got  %+v\n    want %+v", p, g, w))
		}
	}
	for p, g := range got {
		if _, ok := want[p]; !ok {
			diffs = append(diffs, fmt.Sprintf("  %s: unexpected %+v", p, g))
		}
	}
	if len(diffs) > 0 {
		sort.Strings(diffs)
		t.Fatalf("%s differs:\n%s", what, strings.Join(diffs, "\n"))
	}
}

// populate fills a volume with one of everything a copy has to keep. It reports whether the
// filesystem took a user extended attribute.
func populate(t *testing.T, dir string) (xattrs bool) {
	t.Helper()
	p := func(name string) string { return filepath.Join(dir, name) }
	must(t, "mkdir sub", os.Mkdir(p("sub"), 0o750))
	must(t, "chown sub", os.Chown(p("sub"), 1234, 1234))
	must(t, "write data.txt", os.WriteFile(p("sub/data.txt"), []byte("hello, ferry\n"), 0o600))
	must(t, "chmod data.txt", os.Chmod(p("sub/data.txt"), 0o640))
	must(t, "chown data.txt", os.Chown(p("sub/data.txt"), 1234, 5678))
	must(t, "hard link", os.Link(p("sub/data.txt"), p("sub/hardlink")))
	must(t, "symlink", os.Symlink("sub/data.txt", p("link")))
	must(t, "lchown link", os.Lchown(p("link"), 1234, 1234))
	must(t, "write tool", os.WriteFile(p("tool"), []byte("#!/bin/sh\necho hi\n"), 0o755))
	must(t, "chown tool", os.Chown(p("tool"), 1234, 1234))
	must(t, "chmod tool", os.Chmod(p("tool"), 0o4755)) // after chown, which clears set-user-ID
	f, err := os.Create(p("sparse"))
	must(t, "create sparse", err)
	must(t, "truncate sparse", f.Truncate(4<<20))
	_, err = f.WriteAt([]byte("data in the middle"), 1<<20)
	must(t, "write sparse", err)
	must(t, "close sparse", f.Close())
	must(t, "mkfifo", unix.Mkfifo(p("fifo"), 0o600))
	must(t, "mkdir shared", os.Mkdir(p("shared"), 0o755))
	must(t, "chmod shared", os.Chmod(p("shared"), 0o1777))

	err = unix.Lsetxattr(p("sub/data.txt"), "user.ferry", []byte("kept"), 0)
	if errors.Is(err, unix.ENOTSUP) {
		t.Logf("%s takes no user xattrs: not checking them", dir)
	} else {
		must(t, "setxattr", err)
		xattrs = true
	}

	// Distinct times, directories last (adding to a directory moves its times).
	base := time.Date(2001, 2, 3, 4, 5, 6, 789, time.UTC)
	for i, name := range []string{"sub/data.txt", "link", "tool", "sparse", "fifo", "shared", "sub", "."} {
		ts := []unix.Timespec{
			unix.NsecToTimespec(base.Add(time.Duration(i) * time.Hour).UnixNano()),
			unix.NsecToTimespec(base.Add(time.Duration(i)*time.Hour + time.Minute).UnixNano()),
		}
		must(t, "utimensat "+name, unix.UtimesNanoAt(unix.AT_FDCWD, p(name), ts, unix.AT_SYMLINK_NOFOLLOW))
	}
	return xattrs
}

// checkSparse checks that a copy of populate's sparse file kept its holes.
func checkSparse(t *testing.T, path string) {
	t.Helper()
	var st unix.Stat_t
	must(t, "stat sparse", unix.Stat(path, &st))
	if st.Size != 4<<20 || st.Blocks*512 >= 1<<20 {
		t.Fatalf("%s: size %d, %d bytes allocated; want 4 MiB with holes", path, st.Size, st.Blocks*512)
	}
}

// isBindOf says whether path shows dir: a bind mount has the root inode of what it binds.
func isBindOf(t *testing.T, path, dir string) bool {
	t.Helper()
	a, err := os.Stat(path)
	if err != nil {
		return false
	}
	b, err := os.Stat(dir)
	must(t, "stat", err)
	return os.SameFile(a, b)
}

func mounted(t *testing.T, path string) bool {
	t.Helper()
	_, ok, err := findMount(path)
	must(t, "findMount", err)
	return ok
}

func TestIdentity(t *testing.T) {
	h := startDriver(t, nil)
	info, err := h.ids.GetPluginInfo(h.ctx, &csi.GetPluginInfoRequest{})
	must(t, "GetPluginInfo", err)
	if info.GetName() != "csi.ferry.dev" || info.GetVendorVersion() == "" {
		t.Fatalf("GetPluginInfo: %v", info)
	}
	caps, err := h.ids.GetPluginCapabilities(h.ctx, &csi.GetPluginCapabilitiesRequest{})
	must(t, "GetPluginCapabilities", err)
	var got []csi.PluginCapability_Service_Type
	for _, c := range caps.GetCapabilities() {
		got = append(got, c.GetService().GetType())
	}
	if fmt.Sprint(got) != "[CONTROLLER_SERVICE SNAPSHOT_METADATA_SERVICE VOLUME_ACCESSIBILITY_CONSTRAINTS]" {
		t.Fatalf("plugin capabilities: %v", got)
	}
	probe, err := h.ids.Probe(h.ctx, &csi.ProbeRequest{})
	must(t, "Probe", err)
	if !probe.GetReady().GetValue() {
		t.Fatal("Probe: not ready")
	}
	ni, err := h.node.NodeGetInfo(h.ctx, &csi.NodeGetInfoRequest{})
	must(t, "NodeGetInfo", err)
	if ni.GetNodeId() != "node-1" || ni.GetAccessibleTopology().GetSegments()["topology.csi.ferry.dev/node"] != "node-1" {
		t.Fatalf("NodeGetInfo: %v", ni)
	}
	nc, err := h.node.NodeGetCapabilities(h.ctx, &csi.NodeGetCapabilitiesRequest{})
	must(t, "NodeGetCapabilities", err)
	if len(nc.GetCapabilities()) != 1 || nc.GetCapabilities()[0].GetRpc().GetType() != csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME {
		t.Fatalf("NodeGetCapabilities: %v", nc)
	}
	cc, err := h.ctl.ControllerGetCapabilities(h.ctx, &csi.ControllerGetCapabilitiesRequest{})
	must(t, "ControllerGetCapabilities", err)
	have := map[csi.ControllerServiceCapability_RPC_Type]bool{}
	for _, c := range cc.GetCapabilities() {
		have[c.GetRpc().GetType()] = true
	}
	for _, want := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
		csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
	} {
		if !have[want] {
			t.Errorf("ControllerGetCapabilities lacks %v: %v", want, cc)
		}
	}
}

func TestRegistration(t *testing.T) {
	// A socket left behind by a killed driver must not stop the next one.
	var stale string
	h := startDriver(t, func(cfg *config) {
		stale = filepath.Join(cfg.RegistrationDir, cfg.DriverName+"-reg.sock")
		must(t, "mkdir", os.MkdirAll(cfg.RegistrationDir, 0o755))
		l, err := net.Listen("unix", stale)
		must(t, "listen", err)
		l.(*net.UnixListener).SetUnlinkOnClose(false)
		l.Close()
	})

	info, err := h.reg.GetInfo(h.ctx, &registerapi.InfoRequest{})
	must(t, "GetInfo", err)
	if info.GetType() != "CSIPlugin" || info.GetName() != "csi.ferry.dev" || info.GetEndpoint() != h.cfg.CSISocket ||
		fmt.Sprint(info.GetSupportedVersions()) != "[1.0.0]" {
		t.Fatalf("GetInfo: %v", info)
	}

	_, err = h.reg.NotifyRegistrationStatus(h.ctx, &registerapi.RegistrationStatus{PluginRegistered: true})
	must(t, "NotifyRegistrationStatus(true)", err)
	select {
	case err := <-h.regFailed:
		t.Fatalf("a successful registration was taken for a failure: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	_, err = h.reg.NotifyRegistrationStatus(h.ctx, &registerapi.RegistrationStatus{Error: "boom"})
	must(t, "NotifyRegistrationStatus(false)", err)
	select {
	case err := <-h.regFailed:
		if !strings.Contains(err.Error(), "boom") {
			t.Fatalf("registration failure reported as %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a failed registration was not reported")
	}

	h.s.stop() // returns once the failure's stop has
	for _, p := range []string{stale, h.cfg.CSISocket} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still there after stop (%v)", p, err)
		}
	}
}

// TestVolumeLifecycle goes through what Kubernetes does with a volume: create, attach,
// stage, publish (read-write and read-only), snapshot, restore, clone, and back.
func TestVolumeLifecycle(t *testing.T) {
	h := startDriver(t, nil)
	vol := h.createVolume("pvc-1", 1<<20, nil)
	if vol.GetCapacityBytes() != 1<<20 ||
		vol.GetAccessibleTopology()[0].GetSegments()["topology.csi.ferry.dev/node"] != "node-1" {
		t.Fatalf("CreateVolume: %v", vol)
	}
	volDir := h.volumeDir(vol.GetVolumeId())
	xattrs := populate(t, volDir)

	// Attach, stage, publish.
	pub, err := h.ctl.ControllerPublishVolume(h.ctx, &csi.ControllerPublishVolumeRequest{
		VolumeId: vol.GetVolumeId(), NodeId: "node-1", VolumeCapability: rwo})
	must(t, "ControllerPublishVolume", err)
	if len(pub.GetPublishContext()) != 0 {
		t.Fatalf("publish context: %v", pub.GetPublishContext())
	}
	staging := filepath.Join(h.root, "kubelet", "plugins", "kubernetes.io", "csi", "csi.ferry.dev", "x", "globalmount")
	stage := &csi.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging, VolumeCapability: rwo}
	_, err = h.node.NodeStageVolume(h.ctx, stage)
	must(t, "NodeStageVolume", err)
	_, err = h.node.NodeStageVolume(h.ctx, stage)
	must(t, "NodeStageVolume again", err)
	if !isBindOf(t, staging, volDir) {
		t.Fatal("the staging path does not show the volume")
	}
	if n := countMounts(t, staging); n != 1 {
		t.Fatalf("%d mounts on the staging path after staging twice, want 1", n)
	}

	rw := filepath.Join(h.root, "kubelet", "pods", "a", "volumes", "kubernetes.io~csi", "pv", "mount")
	ro := filepath.Join(h.root, "kubelet", "pods", "b", "volumes", "kubernetes.io~csi", "pv", "mount")
	publish := func(target string, readOnly bool) error {
		_, err := h.node.NodePublishVolume(h.ctx, &csi.NodePublishVolumeRequest{
			VolumeId: vol.GetVolumeId(), StagingTargetPath: staging, TargetPath: target,
			VolumeCapability: rwo, Readonly: readOnly})
		return err
	}
	must(t, "NodePublishVolume rw", publish(rw, false))
	must(t, "NodePublishVolume rw again", publish(rw, false))
	wantCode(t, "NodePublishVolume rw as ro", publish(rw, true), codes.AlreadyExists)
	must(t, "NodePublishVolume ro", publish(ro, true))
	for _, target := range []string{rw, ro} {
		if !isBindOf(t, target, volDir) || !mounted(t, target) {
			t.Fatalf("%s does not show the volume", target)
		}
		b, err := os.ReadFile(filepath.Join(target, "link"))
		if err != nil || string(b) != "hello, ferry\n" {
			t.Fatalf("reading through %s: %q, %v", target, b, err)
		}
	}
	must(t, "write through the rw target", os.WriteFile(filepath.Join(rw, "new.txt"), []byte("new"), 0o644))
	if b, err := os.ReadFile(filepath.Join(volDir, "new.txt")); err != nil || string(b) != "new" {
		t.Fatalf("a write through the rw target is not in the volume: %q, %v", b, err)
	}
	must(t, "remove through the rw target", os.Remove(filepath.Join(rw, "new.txt")))
	err = os.WriteFile(filepath.Join(ro, "nope.txt"), []byte("x"), 0o644)
	if !errors.Is(err, syscall.EROFS) {
		t.Fatalf("writing through the read-only target: %v, want EROFS", err)
	}
	if err := os.Chmod(filepath.Join(ro, "tool"), 0o755); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("chmod through the read-only target: %v, want EROFS", err)
	}

	// Snapshot, then change the volume: the snapshot keeps the old contents.
	before := describe(t, volDir)
	snapReq := &csi.CreateSnapshotRequest{Name: "snapshot-1", SourceVolumeId: vol.GetVolumeId()}
	sr, err := h.ctl.CreateSnapshot(h.ctx, snapReq)
	must(t, "CreateSnapshot", err)
	snap := sr.GetSnapshot()
	if !snap.GetReadyToUse() || snap.GetSourceVolumeId() != vol.GetVolumeId() || snap.GetSizeBytes() != 1<<20 || snap.GetCreationTime() == nil {
		t.Fatalf("CreateSnapshot: %v", snap)
	}
	snapDir := h.snapshotDir(snap.GetSnapshotId())
	sameTree(t, "the snapshot", describe(t, snapDir), before)
	checkSparse(t, filepath.Join(snapDir, "sparse"))
	again, err := h.ctl.CreateSnapshot(h.ctx, snapReq)
	must(t, "CreateSnapshot again", err)
	if again.GetSnapshot().GetSnapshotId() != snap.GetSnapshotId() || !again.GetSnapshot().GetCreationTime().AsTime().Equal(snap.GetCreationTime().AsTime()) {
		t.Fatalf("CreateSnapshot again: %v, first %v", again.GetSnapshot(), snap)
	}
	for _, req := range []*csi.ListSnapshotsRequest{{SnapshotId: snap.GetSnapshotId()}, {SourceVolumeId: vol.GetVolumeId()}, {}} {
		ls, err := h.ctl.ListSnapshots(h.ctx, req)
		must(t, "ListSnapshots", err)
		if len(ls.GetEntries()) != 1 || ls.GetEntries()[0].GetSnapshot().GetSnapshotId() != snap.GetSnapshotId() {
			t.Fatalf("ListSnapshots(%v): %v", req, ls)
		}
	}
	ls, err := h.ctl.ListSnapshots(h.ctx, &csi.ListSnapshotsRequest{SnapshotId: "snap-000000000000000000000000"})
	must(t, "ListSnapshots unknown", err)
	if len(ls.GetEntries()) != 0 {
		t.Fatalf("ListSnapshots of an unknown ID: %v", ls)
	}

	// Through the rw mount, as a pod would.
	must(t, "change data.txt", os.WriteFile(filepath.Join(rw, "sub", "data.txt"), []byte("changed\n"), 0o600))
	must(t, "chmod sub", os.Chmod(filepath.Join(rw, "sub"), 0o700))
	must(t, "remove link", os.Remove(filepath.Join(rw, "link")))
	must(t, "add a file", os.WriteFile(filepath.Join(rw, "added"), []byte("added"), 0o644))
	after := describe(t, volDir)
	if fmt.Sprint(after) == fmt.Sprint(before) {
		t.Fatal("the changes did not reach the volume")
	}
	sameTree(t, "the snapshot after the volume changed", describe(t, snapDir), before)

	// Restore the snapshot into a new volume, and clone the changed volume.
	fromSnap := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
		Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshotId()}}}
	restored := h.createVolume("pvc-restored", 1<<20, fromSnap)
	if restored.GetContentSource().GetSnapshot().GetSnapshotId() != snap.GetSnapshotId() {
		t.Fatalf("restored volume: %v", restored)
	}
	sameTree(t, "the volume restored from the snapshot", describe(t, h.volumeDir(restored.GetVolumeId())), before)
	checkSparse(t, filepath.Join(h.volumeDir(restored.GetVolumeId()), "sparse"))
	if xattrs && before["sub/data.txt"].Xattrs["user.ferry"] != "kept" {
		t.Fatalf("the test's xattr is not in the description: %+v", before["sub/data.txt"])
	}

	fromVol := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
		Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: vol.GetVolumeId()}}}
	clone := h.createVolume("pvc-clone", 0, fromVol)
	if clone.GetCapacityBytes() != 1<<20 {
		t.Fatalf("a clone without a size should have its source's, got %v", clone)
	}
	sameTree(t, "the clone", describe(t, h.volumeDir(clone.GetVolumeId())), after)

	_, err = h.ctl.CreateVolume(h.ctx, &csi.CreateVolumeRequest{Name: "pvc-small", VolumeCapabilities: []*csi.VolumeCapability{rwo},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 10}, VolumeContentSource: fromSnap})
	wantCode(t, "CreateVolume smaller than its snapshot", err, codes.OutOfRange)
	_, err = h.ctl.CreateVolume(h.ctx, &csi.CreateVolumeRequest{Name: "pvc-nosnap", VolumeCapabilities: []*csi.VolumeCapability{rwo},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: "snap-000000000000000000000000"}}}})
	wantCode(t, "CreateVolume from an unknown snapshot", err, codes.NotFound)

	// Unpublish, unstage, detach.
	for _, target := range []string{rw, ro} {
		for i := range 2 { // the second time: already unpublished
			_, err := h.node.NodeUnpublishVolume(h.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.GetVolumeId(), TargetPath: target})
			must(t, fmt.Sprintf("NodeUnpublishVolume %s #%d", target, i+1), err)
		}
		if mounted(t, target) {
			t.Fatalf("%s is still a mount point", target)
		}
		if _, err := os.Lstat(target); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s was not removed: %v", target, err)
		}
	}
	for i := range 2 {
		_, err := h.node.NodeUnstageVolume(h.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging})
		must(t, fmt.Sprintf("NodeUnstageVolume #%d", i+1), err)
	}
	if mounted(t, staging) || isBindOf(t, staging, volDir) {
		t.Fatal("the staging path still shows the volume")
	}
	if names, _ := os.ReadDir(staging); len(names) != 0 {
		t.Fatalf("the staging path is not empty after unstaging: %v", names)
	}
	_, err = h.ctl.ControllerUnpublishVolume(h.ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: vol.GetVolumeId(), NodeId: "node-1"})
	must(t, "ControllerUnpublishVolume", err)

	// Delete everything, twice.
	for i := range 2 {
		_, err := h.ctl.DeleteSnapshot(h.ctx, &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshotId()})
		must(t, fmt.Sprintf("DeleteSnapshot #%d", i+1), err)
		for _, v := range []*csi.Volume{vol, restored, clone} {
			_, err := h.ctl.DeleteVolume(h.ctx, &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()})
			must(t, fmt.Sprintf("DeleteVolume %s #%d", v.GetVolumeId(), i+1), err)
		}
	}
	for _, dir := range []string{"volumes", "snapshots", "tmp"} {
		if names, err := os.ReadDir(filepath.Join(h.cfg.DataDir, dir)); err != nil || len(names) != 0 {
			t.Errorf("data/%s after deleting everything: %v, %v", dir, names, err)
		}
	}
	ls, err = h.ctl.ListSnapshots(h.ctx, &csi.ListSnapshotsRequest{})
	must(t, "ListSnapshots", err)
	if len(ls.GetEntries()) != 0 {
		t.Fatalf("ListSnapshots after deleting: %v", ls)
	}
}

func countMounts(t *testing.T, path string) int {
	t.Helper()
	mounts, err := readMountinfo()
	must(t, "mountinfo", err)
	n := 0
	for _, m := range mounts {
		if m.mountPoint == path {
			n++
		}
	}
	return n
}

// TestIdempotencyAndErrors checks repeated calls and the status codes of bad ones.
func TestIdempotencyAndErrors(t *testing.T) {
	h := startDriver(t, func(cfg *config) { cfg.Capacity = 10 << 20 })
	create := func(req *csi.CreateVolumeRequest) (*csi.Volume, error) {
		if req.VolumeCapabilities == nil {
			req.VolumeCapabilities = []*csi.VolumeCapability{rwo}
		}
		resp, err := h.ctl.CreateVolume(h.ctx, req)
		return resp.GetVolume(), err
	}

	a, err := create(&csi.CreateVolumeRequest{Name: "a", CapacityRange: &csi.CapacityRange{RequiredBytes: 4 << 20}, Parameters: map[string]string{"k": "v"}})
	must(t, "CreateVolume a", err)
	a2, err := create(&csi.CreateVolumeRequest{Name: "a", CapacityRange: &csi.CapacityRange{RequiredBytes: 4 << 20}, Parameters: map[string]string{"k": "v"}})
	must(t, "CreateVolume a again", err)
	if a.GetVolumeId() != a2.GetVolumeId() || a2.GetCapacityBytes() != 4<<20 {
		t.Fatalf("CreateVolume again: %v, first %v", a2, a)
	}
	_, err = create(&csi.CreateVolumeRequest{Name: "a", CapacityRange: &csi.CapacityRange{RequiredBytes: 8 << 20}, Parameters: map[string]string{"k": "v"}})
	wantCode(t, "CreateVolume a, larger", err, codes.AlreadyExists)
	_, err = create(&csi.CreateVolumeRequest{Name: "a", CapacityRange: &csi.CapacityRange{RequiredBytes: 4 << 20}})
	wantCode(t, "CreateVolume a, other parameters", err, codes.AlreadyExists)

	_, err = create(&csi.CreateVolumeRequest{Name: "b", CapacityRange: &csi.CapacityRange{RequiredBytes: 8 << 20}})
	wantCode(t, "CreateVolume over --capacity", err, codes.ResourceExhausted)
	gc, err := h.ctl.GetCapacity(h.ctx, &csi.GetCapacityRequest{})
	must(t, "GetCapacity", err)
	if gc.GetAvailableCapacity() != 6<<20 {
		t.Fatalf("GetCapacity: %v", gc)
	}

	_, err = create(&csi.CreateVolumeRequest{})
	wantCode(t, "CreateVolume without a name", err, codes.InvalidArgument)
	_, err = create(&csi.CreateVolumeRequest{Name: "c", VolumeCapabilities: []*csi.VolumeCapability{rwo, blockCap}})
	wantCode(t, "CreateVolume block and mount at once", err, codes.InvalidArgument)
	_, err = create(&csi.CreateVolumeRequest{Name: "c", AccessibilityRequirements: &csi.TopologyRequirement{
		Requisite: []*csi.Topology{{Segments: map[string]string{"topology.csi.ferry.dev/node": "node-2"}}}}})
	wantCode(t, "CreateVolume on another node", err, codes.ResourceExhausted)
	_, err = create(&csi.CreateVolumeRequest{Name: "c", AccessibilityRequirements: &csi.TopologyRequirement{
		Requisite: []*csi.Topology{{Segments: map[string]string{"topology.csi.ferry.dev/node": "node-1"}}}}})
	must(t, "CreateVolume on this node", err)

	vr, err := h.ctl.ValidateVolumeCapabilities(h.ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: a.GetVolumeId(), VolumeCapabilities: []*csi.VolumeCapability{rwo}})
	must(t, "ValidateVolumeCapabilities", err)
	if vr.GetConfirmed() == nil {
		t.Fatalf("ValidateVolumeCapabilities: %v", vr)
	}
	_, err = h.ctl.ValidateVolumeCapabilities(h.ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: "vol-000000000000000000000000", VolumeCapabilities: []*csi.VolumeCapability{rwo}})
	wantCode(t, "ValidateVolumeCapabilities of an unknown volume", err, codes.NotFound)
	lv, err := h.ctl.ListVolumes(h.ctx, &csi.ListVolumesRequest{MaxEntries: 1})
	must(t, "ListVolumes", err)
	if len(lv.GetEntries()) != 1 || lv.GetNextToken() == "" {
		t.Fatalf("ListVolumes page 1: %v", lv)
	}
	lv, err = h.ctl.ListVolumes(h.ctx, &csi.ListVolumesRequest{StartingToken: lv.GetNextToken()})
	must(t, "ListVolumes page 2", err)
	if len(lv.GetEntries()) != 1 || lv.GetNextToken() != "" {
		t.Fatalf("ListVolumes page 2: %v", lv)
	}

	_, err = h.ctl.ControllerPublishVolume(h.ctx, &csi.ControllerPublishVolumeRequest{VolumeId: "vol-000000000000000000000000", NodeId: "node-1", VolumeCapability: rwo})
	wantCode(t, "ControllerPublishVolume of an unknown volume", err, codes.NotFound)
	_, err = h.ctl.ControllerPublishVolume(h.ctx, &csi.ControllerPublishVolumeRequest{VolumeId: a.GetVolumeId(), NodeId: "node-2", VolumeCapability: rwo})
	wantCode(t, "ControllerPublishVolume to another node", err, codes.NotFound)
	_, err = h.ctl.ControllerPublishVolume(h.ctx, &csi.ControllerPublishVolumeRequest{VolumeId: a.GetVolumeId(), NodeId: "node-1"})
	wantCode(t, "ControllerPublishVolume without a capability", err, codes.InvalidArgument)

	_, err = h.ctl.CreateSnapshot(h.ctx, &csi.CreateSnapshotRequest{Name: "s"})
	wantCode(t, "CreateSnapshot without a source", err, codes.InvalidArgument)
	_, err = h.ctl.CreateSnapshot(h.ctx, &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: "vol-000000000000000000000000"})
	wantCode(t, "CreateSnapshot of an unknown volume", err, codes.NotFound)
	_, err = h.ctl.CreateSnapshot(h.ctx, &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: a.GetVolumeId()})
	must(t, "CreateSnapshot", err)
	c, err := create(&csi.CreateVolumeRequest{Name: "c"})
	must(t, "CreateVolume c again", err)
	_, err = h.ctl.CreateSnapshot(h.ctx, &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: c.GetVolumeId()})
	wantCode(t, "CreateSnapshot, name reused for another volume", err, codes.AlreadyExists)
	_, err = h.ctl.ListSnapshots(h.ctx, &csi.ListSnapshotsRequest{StartingToken: "x"})
	wantCode(t, "ListSnapshots with a bad token", err, codes.Aborted)

	// Node calls on what is not there.
	target := filepath.Join(h.root, "never-published")
	_, err = h.node.NodeUnpublishVolume(h.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: a.GetVolumeId(), TargetPath: target})
	must(t, "NodeUnpublishVolume of a missing target", err)
	must(t, "mkdir", os.Mkdir(target, 0o755))
	_, err = h.node.NodeUnpublishVolume(h.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: a.GetVolumeId(), TargetPath: target})
	must(t, "NodeUnpublishVolume of an unmounted target", err)
	_, err = h.node.NodeStageVolume(h.ctx, &csi.NodeStageVolumeRequest{VolumeId: "vol-000000000000000000000000",
		StagingTargetPath: filepath.Join(h.root, "stage"), VolumeCapability: rwo})
	wantCode(t, "NodeStageVolume of an unknown volume", err, codes.NotFound)
	_, err = h.node.NodePublishVolume(h.ctx, &csi.NodePublishVolumeRequest{VolumeId: a.GetVolumeId(),
		StagingTargetPath: filepath.Join(h.root, "stage"), TargetPath: target, VolumeCapability: rwo})
	wantCode(t, "NodePublishVolume of an unstaged volume", err, codes.FailedPrecondition)
	_, err = h.node.NodePublishVolume(h.ctx, &csi.NodePublishVolumeRequest{VolumeId: a.GetVolumeId(), TargetPath: "relative", VolumeCapability: rwo})
	wantCode(t, "NodePublishVolume to a relative path", err, codes.InvalidArgument)

	// Without a staging path, publish binds the volume's directory itself.
	_, err = h.node.NodePublishVolume(h.ctx, &csi.NodePublishVolumeRequest{VolumeId: a.GetVolumeId(), TargetPath: target, VolumeCapability: rwo})
	must(t, "NodePublishVolume without staging", err)
	if !isBindOf(t, target, h.volumeDir(a.GetVolumeId())) {
		t.Fatal("the target does not show the volume")
	}
	_, err = h.node.NodeUnpublishVolume(h.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: a.GetVolumeId(), TargetPath: target})
	must(t, "NodeUnpublishVolume", err)

	for i := range 2 {
		_, err := h.ctl.DeleteVolume(h.ctx, &csi.DeleteVolumeRequest{VolumeId: a.GetVolumeId()})
		must(t, fmt.Sprintf("DeleteVolume #%d", i+1), err)
	}
	if _, err := os.Lstat(h.volumeDir(a.GetVolumeId())); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the deleted volume's directory: %v", err)
	}
	_, err = h.ctl.DeleteVolume(h.ctx, &csi.DeleteVolumeRequest{VolumeId: "../../etc"})
	must(t, "DeleteVolume of a malformed ID", err)
	_, err = h.ctl.DeleteVolume(h.ctx, &csi.DeleteVolumeRequest{})
	wantCode(t, "DeleteVolume without an ID", err, codes.InvalidArgument)
}
