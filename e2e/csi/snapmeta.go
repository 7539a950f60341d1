package main

// The CSI SnapshotMetadata service (CSI 1.10, Kubernetes' changed-block tracking): which
// ranges of a block volume's snapshot hold data (GetMetadataAllocated), and which ranges
// changed between two snapshots of one volume (GetMetadataDelta). Kubernetes reaches it
// through the external-snapshot-metadata sidecar, which authenticates the client and
// forwards the call here over the driver's socket.
//
// A snapshot of a block volume here is a sparse copy of the volume's file, so the
// allocated ranges are the file's data (SEEK_DATA/SEEK_HOLE), and a delta is found by
// comparing the two files in blocks of deltaBlock bytes, skipping what is a hole in both.
// A driver with real tracking answers from its own records; the answer's shape is the
// same: ranges of varying length, in order, from the starting offset, at most MaxResults
// to a message.

import (
	"bytes"
	"errors"
	"io"
	"os"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// deltaBlock is the unit two snapshots are compared in: a changed byte marks its block.
const deltaBlock = 64 << 10

// defaultResults is how many ranges a message carries when the request leaves it to us.
const defaultResults = 256

type snapshotMetadata struct {
	csi.UnimplementedSnapshotMetadataServer
	*driver
}

// blockSnapshot is snapshot id's record and its open file, refused unless it is a block
// volume's snapshot.
func (s *snapshotMetadata) blockSnapshot(what, id string) (snapshotRecord, *os.File, error) {
	if id == "" {
		return snapshotRecord{}, nil, status.Errorf(codes.InvalidArgument, "%s is required", what)
	}
	rec, ok, err := s.snapshot(id)
	if err != nil {
		return rec, nil, status.Error(codes.Internal, err.Error())
	}
	if !ok {
		return rec, nil, status.Errorf(codes.NotFound, "%s %q not found", what, id)
	}
	if !rec.Block {
		return rec, nil, status.Errorf(codes.InvalidArgument, "%s %q is of a filesystem volume: snapshot metadata is for block volumes", what, id)
	}
	f, err := os.Open(s.snapshotPath(id))
	if err != nil {
		return rec, nil, status.Error(codes.Internal, err.Error())
	}
	return rec, f, nil
}

func checkRange(start, size int64, max int32) (int, error) {
	if start < 0 || start >= size {
		return 0, status.Errorf(codes.OutOfRange, "starting offset %d is outside the volume's %d bytes", start, size)
	}
	if max < 0 {
		return 0, status.Errorf(codes.InvalidArgument, "max results %d is negative", max)
	}
	if max == 0 {
		return defaultResults, nil
	}
	return int(max), nil
}

// ranges batches ranges into messages of at most max, sent by send.
type ranges struct {
	max  int
	have []*csi.BlockMetadata
	send func([]*csi.BlockMetadata) error
}

// add appends [off, off+n), joined to the last range when they touch.
func (r *ranges) add(off, n int64) error {
	if k := len(r.have); k > 0 {
		last := r.have[k-1]
		if last.ByteOffset+last.SizeBytes == off {
			last.SizeBytes += n
			return nil
		}
		if k == r.max {
			if err := r.flush(); err != nil {
				return err
			}
		}
	}
	r.have = append(r.have, &csi.BlockMetadata{ByteOffset: off, SizeBytes: n})
	return nil
}

func (r *ranges) flush() error {
	if len(r.have) == 0 {
		return nil
	}
	err := r.send(r.have)
	r.have = nil
	return err
}

// dataFrom is the first offset at or after off where f holds data, or end when none does.
func dataFrom(f *os.File, off, end int64) (int64, error) {
	at, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
	if errors.Is(err, unix.ENXIO) || (err == nil && at > end) {
		return end, nil
	}
	return at, err
}

// holeFrom is the first offset at or after off where f has a hole (its size at the latest).
func holeFrom(f *os.File, off, end int64) (int64, error) {
	at, err := unix.Seek(int(f.Fd()), off, unix.SEEK_HOLE)
	if errors.Is(err, unix.ENXIO) || (err == nil && at > end) {
		return end, nil
	}
	return at, err
}

func (s *snapshotMetadata) GetMetadataAllocated(req *csi.GetMetadataAllocatedRequest, stream csi.SnapshotMetadata_GetMetadataAllocatedServer) error {
	rec, f, err := s.blockSnapshot("snapshot ID", req.GetSnapshotId())
	if err != nil {
		return err
	}
	defer f.Close()
	size := rec.SizeBytes
	max, err := checkRange(req.GetStartingOffset(), size, req.GetMaxResults())
	if err != nil {
		return err
	}
	out := ranges{max: max, send: func(b []*csi.BlockMetadata) error {
		return stream.Send(&csi.GetMetadataAllocatedResponse{BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH,
			VolumeCapacityBytes: size, BlockMetadata: b})
	}}
	for off := req.GetStartingOffset(); off < size; {
		data, err := dataFrom(f, off, size)
		if err != nil {
			return status.Error(codes.Internal, err.Error())
		}
		if data >= size {
			break
		}
		hole, err := holeFrom(f, data, size)
		if err != nil {
			return status.Error(codes.Internal, err.Error())
		}
		if err := out.add(data, hole-data); err != nil {
			return err
		}
		off = hole
	}
	return out.flush()
}

func (s *snapshotMetadata) GetMetadataDelta(req *csi.GetMetadataDeltaRequest, stream csi.SnapshotMetadata_GetMetadataDeltaServer) error {
	baseRec, base, err := s.blockSnapshot("base snapshot ID", req.GetBaseSnapshotId())
	if err != nil {
		return err
	}
	defer base.Close()
	rec, target, err := s.blockSnapshot("target snapshot ID", req.GetTargetSnapshotId())
	if err != nil {
		return err
	}
	defer target.Close()
	if baseRec.SourceVolumeID != rec.SourceVolumeID {
		return status.Errorf(codes.InvalidArgument, "snapshots %q and %q are of different volumes (%s, %s)",
			baseRec.ID, rec.ID, baseRec.SourceVolumeID, rec.SourceVolumeID)
	}
	if baseRec.Created.After(rec.Created) {
		return status.Errorf(codes.InvalidArgument, "base snapshot %q was taken after target snapshot %q", baseRec.ID, rec.ID)
	}
	size := rec.SizeBytes
	max, err := checkRange(req.GetStartingOffset(), size, req.GetMaxResults())
	if err != nil {
		return err
	}
	out := ranges{max: max, send: func(b []*csi.BlockMetadata) error {
		return stream.Send(&csi.GetMetadataDeltaResponse{BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH,
			VolumeCapacityBytes: size, BlockMetadata: b})
	}}
	a, b := make([]byte, deltaBlock), make([]byte, deltaBlock)
	// From the start of the block the starting offset is in.
	for off := req.GetStartingOffset() / deltaBlock * deltaBlock; off < size; {
		// What is a hole in both is zeros in both: skipped without a read.
		da, err := dataFrom(base, off, size)
		if err != nil {
			return status.Error(codes.Internal, err.Error())
		}
		db, err := dataFrom(target, off, size)
		if err != nil {
			return status.Error(codes.Internal, err.Error())
		}
		if next := min(da, db) / deltaBlock * deltaBlock; next > off {
			off = next
			continue
		}
		n := min(int64(deltaBlock), size-off)
		if err := readBlock(base, a[:n], off); err != nil {
			return status.Error(codes.Internal, err.Error())
		}
		if err := readBlock(target, b[:n], off); err != nil {
			return status.Error(codes.Internal, err.Error())
		}
		if !bytes.Equal(a[:n], b[:n]) {
			if err := out.add(off, n); err != nil {
				return err
			}
		}
		off += n
	}
	return out.flush()
}

// readBlock reads len(p) bytes at off; past the file's end (a snapshot shorter than its
// volume) it reads zeros.
func readBlock(f *os.File, p []byte, off int64) error {
	n, err := f.ReadAt(p, off)
	if errors.Is(err, io.EOF) {
		clear(p[n:])
		return nil
	}
	return err
}
