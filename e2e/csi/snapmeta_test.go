package main

// The SnapshotMetadata service over the driver's socket, as the external-snapshot-metadata
// sidecar calls it: the allocated ranges of a block snapshot, the ranges changed between
// two, paging by MaxResults and StartingOffset, and the refusals.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
)

// collect reads a metadata stream to its end: its ranges, and how many messages carried them.
func collect[T interface {
	GetBlockMetadata() []*csi.BlockMetadata
	GetVolumeCapacityBytes() int64
	GetBlockMetadataType() csi.BlockMetadataType
}](t *testing.T, recv func() (T, error)) (got []string, messages int, err error) {
	t.Helper()
	for {
		m, err := recv()
		if errors.Is(err, io.EOF) {
			return got, messages, nil
		}
		if err != nil {
			return got, messages, err
		}
		messages++
		if m.GetBlockMetadataType() != csi.BlockMetadataType_VARIABLE_LENGTH || m.GetVolumeCapacityBytes() != 8<<20 {
			t.Fatalf("a message of type %v, capacity %d", m.GetBlockMetadataType(), m.GetVolumeCapacityBytes())
		}
		for _, b := range m.GetBlockMetadata() {
			got = append(got, fmt.Sprintf("%d+%d", b.GetByteOffset(), b.GetSizeBytes()))
		}
	}
}

func TestSnapshotMetadataOfBlockSnapshots(t *testing.T) {
	h := startDriver(t, func(c *config) { c.Capacity = 1 << 30 })
	resp, err := h.ctl.CreateVolume(h.ctx, &csi.CreateVolumeRequest{
		Name: "pvc-cbt", CapacityRange: &csi.CapacityRange{RequiredBytes: 8 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{blockCap}})
	must(t, "CreateVolume block", err)
	vol := resp.GetVolume().GetVolumeId()
	file := h.volumeDir(vol)
	write := func(off int64, n int, b byte) {
		t.Helper()
		f, err := os.OpenFile(file, os.O_WRONLY, 0)
		must(t, "open the volume's file", err)
		defer f.Close()
		p := make([]byte, n)
		for i := range p {
			p[i] = b
		}
		_, err = f.WriteAt(p, off)
		must(t, "write the volume's file", err)
	}
	snap := func(name string) string {
		t.Helper()
		r, err := h.ctl.CreateSnapshot(h.ctx, &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: vol})
		must(t, "CreateSnapshot "+name, err)
		return r.GetSnapshot().GetSnapshotId()
	}
	// Data at 1 MiB (256 KiB of it) and at 6 MiB (1 MiB); the rest never written.
	write(1<<20, 256<<10, 0x11)
	write(6<<20, 1<<20, 0x22)
	s1 := snap("cbt-1")
	// Then: 10 bytes inside the first run, a new run at 4 MiB, the second run overwritten
	// with the same bytes (not a change).
	write(1<<20+100_000, 10, 0x33)
	write(4<<20, 128<<10, 0x44)
	write(6<<20, 1<<20, 0x22)
	s2 := snap("cbt-2")

	allocated := func(id string, start int64, max int32) ([]string, int, error) {
		st, err := h.meta.GetMetadataAllocated(h.ctx, &csi.GetMetadataAllocatedRequest{SnapshotId: id, StartingOffset: start, MaxResults: max})
		if err != nil {
			return nil, 0, err
		}
		return collect(t, st.Recv)
	}
	delta := func(base, target string, start int64, max int32) ([]string, int, error) {
		st, err := h.meta.GetMetadataDelta(h.ctx, &csi.GetMetadataDeltaRequest{BaseSnapshotId: base, TargetSnapshotId: target, StartingOffset: start, MaxResults: max})
		if err != nil {
			return nil, 0, err
		}
		return collect(t, st.Recv)
	}
	got, _, err := allocated(s1, 0, 0)
	must(t, "GetMetadataAllocated", err)
	// The snapshot is a sparse copy: its data is where the volume's was (in the file
	// system's blocks, so at least the written bytes).
	if fmt.Sprint(got) != fmt.Sprint([]string{"1048576+262144", "6291456+1048576"}) {
		t.Fatalf("allocated ranges of the first snapshot: %v", got)
	}
	got, _, err = delta(s1, s2, 0, 0)
	must(t, "GetMetadataDelta", err)
	// The 64 KiB block with the 10 bytes, and the two blocks of the new run: not the run
	// written again with the same bytes.
	if fmt.Sprint(got) != fmt.Sprint([]string{"1114112+65536", "4194304+131072"}) {
		t.Fatalf("changed ranges between the snapshots: %v", got)
	}
	// Paging: one range a message; from an offset past the first change.
	got, messages, err := delta(s1, s2, 0, 1)
	must(t, "GetMetadataDelta one a message", err)
	if len(got) != 2 || messages != 2 {
		t.Fatalf("%d messages for %v with max results 1", messages, got)
	}
	got, _, err = delta(s1, s2, 2<<20, 0)
	must(t, "GetMetadataDelta from 2 MiB", err)
	if fmt.Sprint(got) != fmt.Sprint([]string{"4194304+131072"}) {
		t.Fatalf("changed ranges from 2 MiB: %v", got)
	}
	// A snapshot against itself: nothing changed.
	got, _, err = delta(s2, s2, 0, 0)
	must(t, "GetMetadataDelta of one snapshot", err)
	if len(got) != 0 {
		t.Fatalf("a snapshot differs from itself: %v", got)
	}

	// Refusals.
	fsVol, err := h.ctl.CreateVolume(h.ctx, &csi.CreateVolumeRequest{Name: "pvc-fs", VolumeCapabilities: []*csi.VolumeCapability{rwo}})
	must(t, "CreateVolume filesystem", err)
	fsSnap, err := h.ctl.CreateSnapshot(h.ctx, &csi.CreateSnapshotRequest{Name: "fs-1", SourceVolumeId: fsVol.GetVolume().GetVolumeId()})
	must(t, "CreateSnapshot filesystem", err)
	other, err := h.ctl.CreateVolume(h.ctx, &csi.CreateVolumeRequest{
		Name: "pvc-other", CapacityRange: &csi.CapacityRange{RequiredBytes: 8 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{blockCap}})
	must(t, "CreateVolume other", err)
	otherSnap, err := h.ctl.CreateSnapshot(h.ctx, &csi.CreateSnapshotRequest{Name: "other-1", SourceVolumeId: other.GetVolume().GetVolumeId()})
	must(t, "CreateSnapshot other", err)
	for _, c := range []struct {
		what string
		err  error
		code codes.Code
	}{
		{"no snapshot", second(allocated("", 0, 0)), codes.InvalidArgument},
		{"an unknown snapshot", second(allocated("snap-nope", 0, 0)), codes.NotFound},
		{"a filesystem snapshot", second(allocated(fsSnap.GetSnapshot().GetSnapshotId(), 0, 0)), codes.InvalidArgument},
		{"an offset past the end", second(allocated(s1, 8<<20, 0)), codes.OutOfRange},
		{"a negative max", second(allocated(s1, 0, -1)), codes.InvalidArgument},
		{"snapshots of two volumes", second(delta(s1, otherSnap.GetSnapshot().GetSnapshotId(), 0, 0)), codes.InvalidArgument},
		{"base after target", second(delta(s2, s1, 0, 0)), codes.InvalidArgument},
	} {
		wantCode(t, c.what, c.err, c.code)
	}
}

// second is the error of a (ranges, messages, error) triple.
func second(_ []string, _ int, err error) error { return err }
