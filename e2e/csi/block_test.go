package main

// Block volumes: files shown as loop devices. The kubelet stages a block volume (here: a loop
// device attached, named in the staging directory) and publishes it on a file path (here: the
// device node bound onto it); what a pod writes through it lands in the volume's file.

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
)

var blockCap = &csi.VolumeCapability{
	AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

func TestBlockVolumeLifecycle(t *testing.T) {
	h := startDriver(t, func(c *config) { c.Capacity = 1 << 30 })
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("skipped: no /dev/loop-control for loop devices")
	}
	resp, err := h.ctl.CreateVolume(h.ctx, &csi.CreateVolumeRequest{
		Name: "pvc-block", CapacityRange: &csi.CapacityRange{RequiredBytes: 8 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{blockCap}})
	must(t, "CreateVolume block", err)
	vol := resp.GetVolume()
	file := h.volumeDir(vol.GetVolumeId())
	var st unix.Stat_t
	must(t, "stat the volume's file", unix.Stat(file, &st))
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != 8<<20 || st.Blocks != 0 {
		t.Fatalf("a new block volume is a sparse 8 MiB file: mode %o size %d blocks %d", st.Mode, st.Size, st.Blocks)
	}
	_, err = h.node.NodeStageVolume(h.ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(),
		StagingTargetPath: filepath.Join(h.root, "staging-x"), VolumeCapability: rwo})
	wantCode(t, "NodeStageVolume of a block volume as a mount", err, codes.InvalidArgument)

	// The kubelet's paths for a block volume: a staging directory, a publish file per pod.
	staging := filepath.Join(h.root, "kubelet", "plugins", "kubernetes.io", "csi", "volumeDevices", "staging", "pv")
	target := filepath.Join(h.root, "kubelet", "plugins", "kubernetes.io", "csi", "volumeDevices", "publish", "pv", "pod-a")
	stage := &csi.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging, VolumeCapability: blockCap}
	for _, what := range []string{"NodeStageVolume", "NodeStageVolume again"} {
		_, err = h.node.NodeStageVolume(h.ctx, stage)
		must(t, what, err)
	}
	dev, ok, err := stagedLoop(staging)
	if err != nil || !ok {
		t.Fatalf("no loop device named in the staging directory: %v", err)
	}
	publish := &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: blockCap}
	for _, what := range []string{"NodePublishVolume", "NodePublishVolume again"} {
		_, err = h.node.NodePublishVolume(h.ctx, publish)
		must(t, what, err)
	}
	var devSt, targetSt unix.Stat_t
	must(t, "stat the loop device", unix.Stat(dev, &devSt))
	must(t, "stat the target", unix.Stat(target, &targetSt))
	if targetSt.Mode&unix.S_IFMT != unix.S_IFBLK || targetSt.Rdev != devSt.Rdev {
		t.Fatalf("the target is not the loop device: mode %o rdev %d, want %d", targetSt.Mode, targetSt.Rdev, devSt.Rdev)
	}
	// Written through the published device, read in the volume's file.
	data := bytes.Repeat([]byte("ferry block "), 1000)
	f, err := os.OpenFile(target, os.O_WRONLY, 0)
	must(t, "open the target", err)
	_, err = f.WriteAt(data, 1<<20)
	must(t, "write through the target", err)
	must(t, "fsync the target", f.Sync())
	f.Close()
	got := make([]byte, len(data))
	vf, err := os.Open(file)
	must(t, "open the volume's file", err)
	_, err = vf.ReadAt(got, 1<<20)
	vf.Close()
	must(t, "read the volume's file", err)
	if !bytes.Equal(got, data) {
		t.Fatal("a write through the device is not in the volume's file")
	}
	_, err = h.node.NodePublishVolume(h.ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(),
		StagingTargetPath: staging, TargetPath: target + "-ro", VolumeCapability: blockCap, Readonly: true})
	wantCode(t, "NodePublishVolume read-only", err, codes.InvalidArgument)

	// A snapshot and a volume restored from it are block volumes with the same bytes.
	sr, err := h.ctl.CreateSnapshot(h.ctx, &csi.CreateSnapshotRequest{Name: "snap-b", SourceVolumeId: vol.GetVolumeId()})
	must(t, "CreateSnapshot of a block volume", err)
	restored, err := h.ctl.CreateVolume(h.ctx, &csi.CreateVolumeRequest{Name: "pvc-restored",
		VolumeCapabilities:  []*csi.VolumeCapability{blockCap},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: sr.GetSnapshot().GetSnapshotId()}}}})
	must(t, "CreateVolume from the block snapshot", err)
	a, _ := os.ReadFile(file)
	b, _ := os.ReadFile(h.volumeDir(restored.GetVolume().GetVolumeId()))
	if len(a) != 8<<20 || !bytes.Equal(a, b) {
		t.Fatalf("the restored volume differs (%d and %d bytes)", len(a), len(b))
	}
	_, err = h.ctl.CreateVolume(h.ctx, &csi.CreateVolumeRequest{Name: "pvc-fs-from-block",
		VolumeCapabilities:  []*csi.VolumeCapability{rwo},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: sr.GetSnapshot().GetSnapshotId()}}}})
	wantCode(t, "a filesystem volume from a block snapshot", err, codes.InvalidArgument)

	// Unpublish removes the target; unstage detaches the loop device.
	_, err = h.node.NodeUnpublishVolume(h.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: vol.GetVolumeId(), TargetPath: target})
	must(t, "NodeUnpublishVolume", err)
	if _, err := os.Lstat(target); !os.IsNotExist(err) {
		t.Fatalf("the target is still there: %v", err)
	}
	_, err = h.node.NodeUnstageVolume(h.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging})
	must(t, "NodeUnstageVolume", err)
	if b, err := os.ReadFile("/sys/block/" + filepath.Base(dev) + "/loop/backing_file"); err == nil {
		t.Fatalf("%s still backed by %s after unstaging", dev, b)
	}
}
