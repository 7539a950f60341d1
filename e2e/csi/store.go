package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// On disk, under --data-dir:
//
//	volumes/<id>/         the volume: a plain directory, bind-mounted into pods
//	volumes/<id>.json     its record (volumeRecord); a volume exists iff this file does
//	snapshots/<id>/       a snapshot: a copy of a volume's tree
//	snapshots/<id>.json   its record (snapshotRecord)
//	tmp/<id>/             a tree being filled, renamed into place when complete
//
// The record is written last and removed first, so a crash in between leaves a directory
// without a record, which the next Create or Delete of that name removes.

// volumeRecord is what CreateVolume needs to answer a repeated call the same way.
type volumeRecord struct {
	Name             string            `json:"name"`
	ID               string            `json:"id"`
	CapacityBytes    int64             `json:"capacityBytes"`
	Parameters       map[string]string `json:"parameters,omitempty"`
	SourceSnapshotID string            `json:"sourceSnapshotID,omitempty"`
	SourceVolumeID   string            `json:"sourceVolumeID,omitempty"`
	// Block: the volume is a file of CapacityBytes (sparse), published as a loop device
	// instead of a directory.
	Block   bool      `json:"block,omitempty"`
	Created time.Time `json:"created"`
}

type snapshotRecord struct {
	Name           string    `json:"name"`
	ID             string    `json:"id"`
	SourceVolumeID string    `json:"sourceVolumeID"`
	SizeBytes      int64     `json:"sizeBytes"`
	Block          bool      `json:"block,omitempty"`
	Created        time.Time `json:"created"`
}

const (
	volumePrefix   = "vol-"
	snapshotPrefix = "snap-"
)

// IDs are derived from the request's name, so a repeated CreateVolume or CreateSnapshot
// (the sidecars retry after timeouts) finds the first one's result.
func makeID(prefix, name string) string {
	sum := sha256.Sum256([]byte(name))
	return prefix + hex.EncodeToString(sum[:12])
}

var idPattern = regexp.MustCompile(`^[0-9a-f]{24}$`)

// validID says whether id could have come from makeID(prefix, ...). Anything else names no
// volume or snapshot, and is never used in a path (no "../" tricks).
func validID(prefix, id string) bool {
	return strings.HasPrefix(id, prefix) && idPattern.MatchString(strings.TrimPrefix(id, prefix))
}

func (d *driver) volumePath(id string) string {
	return filepath.Join(d.cfg.DataDir, "volumes", id)
}

func (d *driver) snapshotPath(id string) string {
	return filepath.Join(d.cfg.DataDir, "snapshots", id)
}

func (d *driver) tmpPath(id string) string {
	return filepath.Join(d.cfg.DataDir, "tmp", id)
}

// volume reads a volume's record; ok is false if there is no such volume.
func (d *driver) volume(id string) (rec volumeRecord, ok bool, err error) {
	if !validID(volumePrefix, id) {
		return rec, false, nil
	}
	ok, err = readRecord(d.volumePath(id)+".json", &rec)
	return rec, ok, err
}

func (d *driver) snapshot(id string) (rec snapshotRecord, ok bool, err error) {
	if !validID(snapshotPrefix, id) {
		return rec, false, nil
	}
	ok, err = readRecord(d.snapshotPath(id)+".json", &rec)
	return rec, ok, err
}

func readRecord(path string, v any) (bool, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, json.Unmarshal(b, v)
}

// writeRecord writes through a temporary file and a rename, so a record is whole or absent.
func writeRecord(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// records reads every record in dir ("volumes" or "snapshots"), sorted by creation time
// then ID, so that list pagination is stable.
func records[T any](d *driver, dir string, created func(*T) time.Time, id func(*T) string) ([]T, error) {
	paths, err := filepath.Glob(filepath.Join(d.cfg.DataDir, dir, "*.json"))
	if err != nil {
		return nil, err
	}
	out := make([]T, 0, len(paths))
	for _, p := range paths {
		var rec T
		ok, err := readRecord(p, &rec)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, rec)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		ci, cj := created(&out[i]), created(&out[j])
		if !ci.Equal(cj) {
			return ci.Before(cj)
		}
		return id(&out[i]) < id(&out[j])
	})
	return out, nil
}

func (d *driver) volumes() ([]volumeRecord, error) {
	return records(d, "volumes",
		func(r *volumeRecord) time.Time { return r.Created }, func(r *volumeRecord) string { return r.ID })
}

func (d *driver) snapshots() ([]snapshotRecord, error) {
	return records(d, "snapshots",
		func(r *snapshotRecord) time.Time { return r.Created }, func(r *snapshotRecord) string { return r.ID })
}
