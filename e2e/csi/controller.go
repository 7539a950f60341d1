package main

import (
	"context"
	"maps"
	"os"
	"strconv"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// controller is the CSI Controller service: volumes and snapshots as directories.
type controller struct {
	csi.UnimplementedControllerServer
	*driver
}

func (c *controller) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	types := []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
		csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
	}
	if c.cfg.Capacity > 0 {
		types = append(types, csi.ControllerServiceCapability_RPC_GET_CAPACITY)
	}
	caps := make([]*csi.ControllerServiceCapability, len(types))
	for i, t := range types {
		caps[i] = &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{
			Rpc: &csi.ControllerServiceCapability_RPC{Type: t}}}
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

// checkCapabilities accepts filesystem volumes (directories) and block volumes (files
// published as loop devices) in any access mode, and says which: every capability of one
// request must ask for the same access type.
func checkCapabilities(caps []*csi.VolumeCapability) (block bool, err error) {
	if len(caps) == 0 {
		return false, status.Error(codes.InvalidArgument, "volume capabilities are required")
	}
	for i, c := range caps {
		isBlock := c.GetBlock() != nil
		if !isBlock && c.GetMount() == nil {
			return false, status.Error(codes.InvalidArgument, "an access type (mount or block) is required")
		}
		if i > 0 && isBlock != block {
			return false, status.Error(codes.InvalidArgument, "capabilities ask for both mount and block access")
		}
		block = isBlock
		if c.GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_UNKNOWN {
			return false, status.Error(codes.InvalidArgument, "an access mode is required")
		}
	}
	return block, nil
}

// defaultBlockBytes is a block volume's size when the request names none (a device has one).
const defaultBlockBytes = 64 << 20

// accessType names a volume's kind in messages.
func accessType(block bool) string {
	if block {
		return "block"
	}
	return "mount"
}

// checkTopology refuses requirements this node cannot meet: with topology, a volume is on
// this node only.
func (c *controller) checkTopology(req *csi.TopologyRequirement) error {
	if c.cfg.TopologyKey == "" || req == nil {
		return nil
	}
	wanted := req.GetRequisite()
	if len(wanted) == 0 {
		wanted = req.GetPreferred()
	}
	if len(wanted) == 0 {
		return nil
	}
	for _, t := range wanted {
		if v, ok := t.GetSegments()[c.cfg.TopologyKey]; ok && v == c.cfg.TopologyValue {
			return nil
		}
	}
	return status.Errorf(codes.ResourceExhausted, "volumes are only accessible at %s=%s", c.cfg.TopologyKey, c.cfg.TopologyValue)
}

// fits says whether a volume of size bytes satisfies a capacity range.
func fits(size int64, r *csi.CapacityRange) bool {
	return size >= r.GetRequiredBytes() && (r.GetLimitBytes() == 0 || size <= r.GetLimitBytes())
}

func (c *controller) volumeOf(rec *volumeRecord) *csi.Volume {
	v := &csi.Volume{VolumeId: rec.ID, CapacityBytes: rec.CapacityBytes, AccessibleTopology: c.topology()}
	switch {
	case rec.SourceSnapshotID != "":
		v.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: rec.SourceSnapshotID}}}
	case rec.SourceVolumeID != "":
		v.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
			Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: rec.SourceVolumeID}}}
	}
	return v
}

func (c *controller) CreateVolume(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	block, err := checkCapabilities(req.GetVolumeCapabilities())
	if err != nil {
		return nil, err
	}
	if err := c.checkTopology(req.GetAccessibilityRequirements()); err != nil {
		return nil, err
	}
	r := req.GetCapacityRange()
	if r.GetRequiredBytes() < 0 || r.GetLimitBytes() < 0 || (r.GetLimitBytes() > 0 && r.GetRequiredBytes() > r.GetLimitBytes()) {
		return nil, status.Errorf(codes.InvalidArgument, "invalid capacity range %v", r)
	}
	want := volumeRecord{
		Name:             req.GetName(),
		ID:               makeID(volumePrefix, req.GetName()),
		Parameters:       req.GetParameters(),
		SourceSnapshotID: req.GetVolumeContentSource().GetSnapshot().GetSnapshotId(),
		SourceVolumeID:   req.GetVolumeContentSource().GetVolume().GetVolumeId(),
		Block:            block,
	}
	if src := req.GetVolumeContentSource(); src != nil && want.SourceSnapshotID == "" && want.SourceVolumeID == "" {
		return nil, status.Error(codes.InvalidArgument, "volume content source has no snapshot or volume ID")
	}

	c.controllerMu.Lock()
	defer c.controllerMu.Unlock()

	have, ok, err := c.volume(want.ID)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if ok {
		// The same name again: the same answer, unless the request differs.
		if !fits(have.CapacityBytes, r) || !maps.Equal(have.Parameters, want.Parameters) ||
			have.SourceSnapshotID != want.SourceSnapshotID || have.SourceVolumeID != want.SourceVolumeID ||
			have.Block != want.Block {
			return nil, status.Errorf(codes.AlreadyExists,
				"volume %q (%s) exists with a different capacity, parameters, content source or access type", have.Name, have.ID)
		}
		return &csi.CreateVolumeResponse{Volume: c.volumeOf(&have)}, nil
	}

	// Where the content comes from, and the least size the new volume needs to hold it.
	var from string
	var srcSize int64
	switch {
	case want.SourceSnapshotID != "":
		snap, ok, err := c.snapshot(want.SourceSnapshotID)
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		if !ok {
			return nil, status.Errorf(codes.NotFound, "source snapshot %q not found", want.SourceSnapshotID)
		}
		if snap.Block != block {
			return nil, status.Errorf(codes.InvalidArgument, "snapshot %s is of a %s volume, and this one is %s", snap.ID, accessType(snap.Block), accessType(block))
		}
		from, srcSize = c.snapshotPath(snap.ID), snap.SizeBytes
	case want.SourceVolumeID != "":
		vol, ok, err := c.volume(want.SourceVolumeID)
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		if !ok {
			return nil, status.Errorf(codes.NotFound, "source volume %q not found", want.SourceVolumeID)
		}
		if vol.Block != block {
			return nil, status.Errorf(codes.InvalidArgument, "volume %s is a %s volume, and this one is %s", vol.ID, accessType(vol.Block), accessType(block))
		}
		from, srcSize = c.volumePath(vol.ID), vol.CapacityBytes
	}
	want.CapacityBytes = max(r.GetRequiredBytes(), srcSize)
	if block && want.CapacityBytes == 0 {
		want.CapacityBytes = defaultBlockBytes
	}
	if r.GetRequiredBytes() > 0 && r.GetRequiredBytes() < srcSize {
		return nil, status.Errorf(codes.OutOfRange, "the source is %d bytes, more than the %d requested", srcSize, r.GetRequiredBytes())
	}
	if !fits(want.CapacityBytes, r) {
		return nil, status.Errorf(codes.OutOfRange, "the source is %d bytes, over the limit of %d", srcSize, r.GetLimitBytes())
	}
	if err := c.checkCapacity(want.CapacityBytes); err != nil {
		return nil, err
	}

	// Fill a directory under tmp/ and rename it into place, so volumes/<id> is never half a
	// copy. Leftovers of an interrupted call for this name (no record) go first.
	dir, tmp := c.volumePath(want.ID), c.tmpPath(want.ID)
	if err := removeAll(dir, tmp); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	switch {
	case block:
		// A device of CapacityBytes: a sparse file, the source's bytes first if any.
		if from != "" {
			err = copyTree(from, tmp)
		} else {
			err = os.WriteFile(tmp, nil, 0o600)
		}
		if err == nil {
			err = os.Truncate(tmp, want.CapacityBytes)
		}
	case from == "":
		// A fresh volume's root looks like a fresh filesystem's: root's, 0755.
		err = os.Mkdir(tmp, 0o755)
		if err == nil {
			err = os.Chmod(tmp, 0o755) // whatever the umask
		}
	default:
		err = copyTree(from, tmp)
	}
	if err == nil {
		err = os.Rename(tmp, dir)
	}
	if err == nil {
		want.Created = time.Now().UTC()
		err = writeRecord(dir+".json", &want)
	}
	if err != nil {
		_ = removeAll(dir, tmp)
		return nil, status.Errorf(codes.Internal, "creating volume %s: %v", want.ID, err)
	}
	return &csi.CreateVolumeResponse{Volume: c.volumeOf(&want)}, nil
}

// checkCapacity refuses a volume that would take the volumes' total over --capacity.
// Capacity is bookkeeping only: nothing stops a volume's directory from growing past it.
func (c *controller) checkCapacity(size int64) error {
	if c.cfg.Capacity == 0 {
		return nil
	}
	used, err := c.usedCapacity()
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	if used+size > c.cfg.Capacity {
		return status.Errorf(codes.ResourceExhausted, "%d bytes requested, %d of %d left", size, c.cfg.Capacity-used, c.cfg.Capacity)
	}
	return nil
}

func (c *controller) usedCapacity() (int64, error) {
	vols, err := c.volumes()
	var used int64
	for _, v := range vols {
		used += v.CapacityBytes
	}
	return used, err
}

func (c *controller) GetCapacity(context.Context, *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	if c.cfg.Capacity == 0 {
		return nil, status.Error(codes.Unimplemented, "no --capacity was given")
	}
	c.controllerMu.Lock()
	defer c.controllerMu.Unlock()
	used, err := c.usedCapacity()
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.GetCapacityResponse{AvailableCapacity: max(c.cfg.Capacity-used, 0)}, nil
}

func removeAll(paths ...string) error {
	for _, p := range paths {
		if err := os.RemoveAll(p); err != nil {
			return err
		}
	}
	return nil
}

// DeleteVolume removes the record, then the tree. An unknown volume is already deleted.
func (c *controller) DeleteVolume(_ context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	if !validID(volumePrefix, id) {
		return &csi.DeleteVolumeResponse{}, nil
	}
	c.controllerMu.Lock()
	defer c.controllerMu.Unlock()
	dir := c.volumePath(id)
	if err := removeIfExists(dir + ".json"); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := removeAll(dir, c.tmpPath(id)); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.DeleteVolumeResponse{}, nil
}

// ControllerPublishVolume has nothing to attach (the directory is already on this node), but
// the call is real: the external-attacher makes it for each VolumeAttachment, and it checks
// that the volume and the node are this driver's.
func (c *controller) ControllerPublishVolume(_ context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	case req.GetNodeId() == "":
		return nil, status.Error(codes.InvalidArgument, "node ID is required")
	case req.GetVolumeCapability() == nil:
		return nil, status.Error(codes.InvalidArgument, "volume capability is required")
	}
	if _, err := checkCapabilities([]*csi.VolumeCapability{req.GetVolumeCapability()}); err != nil {
		return nil, err
	}
	if _, ok, err := c.volume(req.GetVolumeId()); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	} else if !ok {
		return nil, status.Errorf(codes.NotFound, "volume %q not found", req.GetVolumeId())
	}
	if req.GetNodeId() != c.cfg.NodeID {
		return nil, status.Errorf(codes.NotFound, "node %q not found: this driver serves node %q", req.GetNodeId(), c.cfg.NodeID)
	}
	return &csi.ControllerPublishVolumeResponse{}, nil
}

// ControllerUnpublishVolume succeeds for unknown volumes and nodes too, as the spec asks of a
// volume that can be regarded as detached.
func (c *controller) ControllerUnpublishVolume(_ context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}

func (c *controller) ValidateVolumeCapabilities(_ context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume capabilities are required")
	}
	vol, ok, err := c.volume(req.GetVolumeId())
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	} else if !ok {
		return nil, status.Errorf(codes.NotFound, "volume %q not found", req.GetVolumeId())
	}
	block, err := checkCapabilities(req.GetVolumeCapabilities())
	if err == nil && block != vol.Block {
		err = status.Errorf(codes.InvalidArgument, "volume %s is a %s volume", vol.ID, accessType(vol.Block))
	}
	if err != nil {
		// Not confirmed: the answer carries why, the call itself succeeds.
		return &csi.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

// page cuts a list for max_entries and starting_token (an index into the sorted list).
func page(n int, maxEntries int32, token string) (from, to int, next string, err error) {
	if maxEntries < 0 {
		return 0, 0, "", status.Error(codes.InvalidArgument, "max_entries must not be negative")
	}
	if token != "" {
		from, err = strconv.Atoi(token)
		if err != nil || from < 0 || from > n {
			return 0, 0, "", status.Errorf(codes.Aborted, "invalid starting token %q", token)
		}
	}
	to = n
	if maxEntries > 0 && from+int(maxEntries) < n {
		to = from + int(maxEntries)
		next = strconv.Itoa(to)
	}
	return from, to, next, nil
}

func (c *controller) ListVolumes(_ context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	c.controllerMu.Lock()
	vols, err := c.volumes()
	c.controllerMu.Unlock()
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	from, to, next, err := page(len(vols), req.GetMaxEntries(), req.GetStartingToken())
	if err != nil {
		return nil, err
	}
	resp := &csi.ListVolumesResponse{NextToken: next}
	for i := from; i < to; i++ {
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{Volume: c.volumeOf(&vols[i])})
	}
	return resp, nil
}

func snapshotOf(rec *snapshotRecord) *csi.Snapshot {
	return &csi.Snapshot{
		SnapshotId:     rec.ID,
		SourceVolumeId: rec.SourceVolumeID,
		SizeBytes:      rec.SizeBytes,
		CreationTime:   timestamppb.New(rec.Created),
		// The copy is complete when CreateSnapshot answers: there is no upload phase.
		ReadyToUse: true,
	}
}

// CreateSnapshot copies the source volume's tree. The copy is not atomic: a file written
// while it runs may be caught before or after the write (see README.md).
func (c *controller) CreateSnapshot(_ context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	if req.GetSourceVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "source volume ID is required")
	}
	want := snapshotRecord{Name: req.GetName(), ID: makeID(snapshotPrefix, req.GetName()), SourceVolumeID: req.GetSourceVolumeId()}

	c.controllerMu.Lock()
	defer c.controllerMu.Unlock()

	have, ok, err := c.snapshot(want.ID)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if ok {
		if have.SourceVolumeID != want.SourceVolumeID {
			return nil, status.Errorf(codes.AlreadyExists, "snapshot %q (%s) exists, of volume %s", have.Name, have.ID, have.SourceVolumeID)
		}
		return &csi.CreateSnapshotResponse{Snapshot: snapshotOf(&have)}, nil
	}
	vol, ok, err := c.volume(want.SourceVolumeID)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if !ok {
		return nil, status.Errorf(codes.NotFound, "source volume %q not found", want.SourceVolumeID)
	}

	dir, tmp := c.snapshotPath(want.ID), c.tmpPath(want.ID)
	if err := removeAll(dir, tmp); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	want.Created = time.Now().UTC()
	err = copyTree(c.volumePath(vol.ID), tmp)
	// The size is the source volume's, as for a block device's snapshot: Kubernetes shows it
	// as the VolumeSnapshot's restoreSize, and a claim restored from it must be this large.
	want.SizeBytes = vol.CapacityBytes
	want.Block = vol.Block
	if err == nil && want.SizeBytes == 0 {
		want.SizeBytes, err = treeSize(tmp)
	}
	if err == nil {
		err = os.Rename(tmp, dir)
	}
	if err == nil {
		err = writeRecord(dir+".json", &want)
	}
	if err != nil {
		_ = removeAll(dir, tmp)
		return nil, status.Errorf(codes.Internal, "creating snapshot %s: %v", want.ID, err)
	}
	return &csi.CreateSnapshotResponse{Snapshot: snapshotOf(&want)}, nil
}

func (c *controller) DeleteSnapshot(_ context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	id := req.GetSnapshotId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot ID is required")
	}
	if !validID(snapshotPrefix, id) {
		return &csi.DeleteSnapshotResponse{}, nil
	}
	c.controllerMu.Lock()
	defer c.controllerMu.Unlock()
	dir := c.snapshotPath(id)
	if err := removeIfExists(dir + ".json"); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := removeAll(dir, c.tmpPath(id)); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.DeleteSnapshotResponse{}, nil
}

// ListSnapshots lists all snapshots, or those of one ID or of one source volume. An unknown
// ID gives an empty list, not an error (the spec's answer, which the snapshotter expects).
func (c *controller) ListSnapshots(_ context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	c.controllerMu.Lock()
	all, err := c.snapshots()
	c.controllerMu.Unlock()
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	var snaps []snapshotRecord
	for _, s := range all {
		if (req.GetSnapshotId() == "" || s.ID == req.GetSnapshotId()) &&
			(req.GetSourceVolumeId() == "" || s.SourceVolumeID == req.GetSourceVolumeId()) {
			snaps = append(snaps, s)
		}
	}
	from, to, next, err := page(len(snaps), req.GetMaxEntries(), req.GetStartingToken())
	if err != nil {
		return nil, err
	}
	resp := &csi.ListSnapshotsResponse{NextToken: next}
	for i := from; i < to; i++ {
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: snapshotOf(&snaps[i])})
	}
	return resp, nil
}
