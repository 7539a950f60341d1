package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// node is the CSI Node service: bind mounts of the volume directories. Mounts are made with
// syscalls, not /bin/mount, so the binary needs nothing else (it would also run from a
// scratch image).
type node struct {
	csi.UnimplementedNodeServer
	*driver
}

func (n *node) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	resp := &csi.NodeGetInfoResponse{NodeId: n.cfg.NodeID}
	if t := n.topology(); t != nil {
		resp.AccessibleTopology = t[0]
	}
	return resp, nil
}

func (n *node) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	// STAGE_UNSTAGE makes the kubelet mount each volume once per node (the "globalmount")
	// and bind that into each pod, as it does for real block-device drivers.
	return &csi.NodeGetCapabilitiesResponse{Capabilities: []*csi.NodeServiceCapability{{
		Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{
			Type: csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME}},
	}}}, nil
}

// requirePath checks a path argument: present and absolute.
func requirePath(name, path string) error {
	if path == "" {
		return status.Errorf(codes.InvalidArgument, "%s is required", name)
	}
	if !filepath.IsAbs(path) {
		return status.Errorf(codes.InvalidArgument, "%s %q is not absolute", name, path)
	}
	return nil
}

// requireVolume checks a volume ID and capability, and that the volume exists and is of the
// access type asked for; it returns the volume's record.
func (n *node) requireVolume(id string, capability *csi.VolumeCapability) (volumeRecord, error) {
	if id == "" {
		return volumeRecord{}, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	if capability == nil {
		return volumeRecord{}, status.Error(codes.InvalidArgument, "volume capability is required")
	}
	block, err := checkCapabilities([]*csi.VolumeCapability{capability})
	if err != nil {
		return volumeRecord{}, err
	}
	rec, ok, err := n.volume(id)
	if err != nil {
		return rec, status.Error(codes.Internal, err.Error())
	} else if !ok {
		return rec, status.Errorf(codes.NotFound, "volume %q not found", id)
	}
	if rec.Block != block {
		return rec, status.Errorf(codes.InvalidArgument, "volume %s is a %s volume, asked for %s access", id, accessType(rec.Block), accessType(block))
	}
	return rec, nil
}

// NodeStageVolume bind-mounts the volume's directory on the staging path.
func (n *node) NodeStageVolume(_ context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	staging := req.GetStagingTargetPath()
	if err := requirePath("staging target path", staging); err != nil {
		return nil, err
	}
	rec, err := n.requireVolume(req.GetVolumeId(), req.GetVolumeCapability())
	if err != nil {
		return nil, err
	}
	n.nodeMu.Lock()
	defer n.nodeMu.Unlock()
	if rec.Block {
		return &csi.NodeStageVolumeResponse{}, n.stageBlock(rec, staging)
	}
	if _, mounted, err := findMount(staging); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	} else if mounted {
		return &csi.NodeStageVolumeResponse{}, nil // staged already: a retry
	}
	if err := os.MkdirAll(staging, 0o750); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := bindMount(n.volumePath(req.GetVolumeId()), staging, false); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

// NodeUnstageVolume unmounts the staging path; the kubelet removes the directory.
func (n *node) NodeUnstageVolume(_ context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	if err := requirePath("staging target path", req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	n.nodeMu.Lock()
	defer n.nodeMu.Unlock()
	// A block volume's staging directory names its loop device: detached, then forgotten.
	if dev, ok, err := stagedLoop(req.GetStagingTargetPath()); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	} else if ok {
		if err := detachLoop(dev); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		if err := removeIfExists(filepath.Join(req.GetStagingTargetPath(), loopMarker)); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		return &csi.NodeUnstageVolumeResponse{}, nil
	}
	if err := unmountAll(req.GetStagingTargetPath()); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// NodePublishVolume bind-mounts the staged volume (or, without a staging path, the volume's
// directory) on the target path, read-only if asked.
func (n *node) NodePublishVolume(_ context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	target := req.GetTargetPath()
	if err := requirePath("target path", target); err != nil {
		return nil, err
	}
	rec, err := n.requireVolume(req.GetVolumeId(), req.GetVolumeCapability())
	if err != nil {
		return nil, err
	}
	n.nodeMu.Lock()
	defer n.nodeMu.Unlock()
	if rec.Block {
		return &csi.NodePublishVolumeResponse{}, n.publishBlock(req)
	}

	source := req.GetStagingTargetPath()
	if source == "" {
		source = n.volumePath(req.GetVolumeId())
	} else if !filepath.IsAbs(source) {
		return nil, status.Errorf(codes.InvalidArgument, "staging target path %q is not absolute", source)
	} else if _, staged, err := findMount(source); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	} else if !staged {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged at %s", req.GetVolumeId(), source)
	}

	if m, mounted, err := findMount(target); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	} else if mounted {
		// Published already: a retry is fine, the same target with the other mode is not.
		if m.readOnly != req.GetReadonly() {
			return nil, status.Errorf(codes.AlreadyExists, "%s is already published with readonly=%v", target, m.readOnly)
		}
		return &csi.NodePublishVolumeResponse{}, nil
	}
	if err := os.MkdirAll(target, 0o750); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := bindMount(source, target, req.GetReadonly()); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// NodeUnpublishVolume unmounts the target and removes its directory; a target that is not
// mounted, or not there at all, is already unpublished.
func (n *node) NodeUnpublishVolume(_ context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	target := req.GetTargetPath()
	if err := requirePath("target path", target); err != nil {
		return nil, err
	}
	n.nodeMu.Lock()
	defer n.nodeMu.Unlock()
	if err := unmountAll(target); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := removeIfExists(target); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// stageBlock attaches a block volume's file to a loop device and names the device in the
// staging directory; a volume staged already (a retry) keeps its device.
func (n *node) stageBlock(rec volumeRecord, staging string) error {
	if _, ok, err := stagedLoop(staging); err != nil {
		return status.Error(codes.Internal, err.Error())
	} else if ok {
		return nil
	}
	if err := os.MkdirAll(staging, 0o750); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	dev, err := attachLoop(n.volumePath(rec.ID))
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	if err := os.WriteFile(filepath.Join(staging, loopMarker), []byte(dev+"\n"), 0o600); err != nil {
		_ = detachLoop(dev)
		return status.Error(codes.Internal, err.Error())
	}
	return nil
}

// publishBlock binds the staged loop device's node onto the target path, a file the driver
// makes (the kubelet gives a block volume's target as a file path, not a directory).
func (n *node) publishBlock(req *csi.NodePublishVolumeRequest) error {
	target := req.GetTargetPath()
	if req.GetReadonly() {
		// A read-only bind of a device node does not stop writes to the device.
		return status.Error(codes.InvalidArgument, "read-only block volumes are not supported")
	}
	dev, ok, err := stagedLoop(req.GetStagingTargetPath())
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	} else if !ok {
		return status.Errorf(codes.FailedPrecondition, "block volume %s is not staged at %q", req.GetVolumeId(), req.GetStagingTargetPath())
	}
	if _, mounted, err := findMount(target); err != nil {
		return status.Error(codes.Internal, err.Error())
	} else if mounted {
		return nil // published already: a retry
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	f, err := os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o600)
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	f.Close()
	if err := bindMount(dev, target, false); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	return nil
}

// bindMount binds source on target. A read-only bind takes a second call: the kernel ignores
// MS_RDONLY on the first MS_BIND and applies it only on a remount of the new mount.
func bindMount(source, target string, readOnly bool) error {
	if err := unix.Mount(source, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mounting %s on %s: %w", source, target, err)
	}
	if !readOnly {
		return nil
	}
	// Keep the flags the new mount inherited (nosuid, nodev, noexec, atime ones): a remount
	// that dropped them would be refused where they are locked, and change more than asked.
	var st unix.Statfs_t
	err := unix.Statfs(target, &st)
	if err == nil {
		keep := uintptr(st.Flags) & (unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC |
			unix.MS_NOATIME | unix.MS_NODIRATIME | unix.MS_RELATIME)
		err = unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|keep, "")
	}
	if err != nil {
		_ = unix.Unmount(target, 0)
		return fmt.Errorf("making %s read-only: %w", target, err)
	}
	return nil
}

// unmountAll unmounts path until nothing is mounted there (a crash between two calls could
// have stacked two mounts). Nothing mounted, or no such path, is success.
func unmountAll(path string) error {
	for range 10 {
		_, mounted, err := findMount(path)
		if err != nil || !mounted {
			return err
		}
		if err := unix.Unmount(path, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("unmounting %s: %w", path, err)
		}
	}
	return fmt.Errorf("%s is still mounted after 10 unmounts", path)
}

// mountEntry is a line of /proc/self/mountinfo.
type mountEntry struct {
	mountPoint string
	readOnly   bool // the mount's own flags ("ro"), not the filesystem's
}

// findMount finds the topmost mount on path in /proc/self/mountinfo: the kernel's own
// answer, unlike comparing st_dev with the parent (a bind mount of the same filesystem has
// the same st_dev).
func findMount(path string) (m mountEntry, ok bool, err error) {
	path = filepath.Clean(path)
	if resolved, err := filepath.EvalSymlinks(path); err == nil {
		path = resolved
	} else if errors.Is(err, fs.ErrNotExist) {
		return m, false, nil
	}
	mounts, err := readMountinfo()
	if err != nil {
		return m, false, err
	}
	// Later lines are mounted on top of earlier ones.
	for i := len(mounts) - 1; i >= 0; i-- {
		if mounts[i].mountPoint == path {
			return mounts[i], true, nil
		}
	}
	return m, false, nil
}

func readMountinfo() ([]mountEntry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mountEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
		// (4) root, (5) mount point, (6) per-mount options.
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 {
			continue
		}
		out = append(out, mountEntry{
			mountPoint: unescapeMountinfo(fields[4]),
			readOnly:   slices.Contains(strings.Split(fields[5], ","), "ro"),
		})
	}
	return out, sc.Err()
}

// unescapeMountinfo undoes the kernel's octal escapes (\040 for a space, \011, \012, \134).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
