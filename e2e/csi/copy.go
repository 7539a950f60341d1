package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// copyTree copies the tree at src to dst, which must not exist, keeping what Ferry itself
// keeps, so a snapshot or a restored volume is a faithful source to copy from: file types
// (regular files, directories, symlinks, fifos, sockets, devices), contents (holes stay
// holes), hard links within the tree, mode bits including set-user-ID, set-group-ID and
// sticky, owner and group, extended attributes (ACLs are among them), and access and
// modification times. Change times and inode numbers cannot be kept.
func copyTree(src, dst string) error {
	c := copier{links: map[inode]string{}}
	return c.copy(src, dst)
}

type inode struct{ dev, ino uint64 }

type copier struct {
	links map[inode]string // first copy of each multiply-linked file, to link the others to
}

func (c *copier) copy(src, dst string) error {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return &fs.PathError{Op: "lstat", Path: src, Err: err}
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		// Owner-only until its own attributes are set, after its contents (which would
		// change its times, and which a read-only mode would keep out).
		if err := os.Mkdir(dst, 0o700); err != nil {
			return err
		}
		entries, err := os.ReadDir(src)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if err := c.copy(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
				return err
			}
		}
	case unix.S_IFREG:
		if st.Nlink > 1 {
			key := inode{uint64(st.Dev), st.Ino}
			if first, ok := c.links[key]; ok {
				return os.Link(first, dst) // the inode's attributes are set already
			}
			c.links[key] = dst
		}
		if err := copyFile(src, dst, st.Size); err != nil {
			return err
		}
	case unix.S_IFLNK:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		if err := os.Symlink(target, dst); err != nil {
			return err
		}
	default: // fifo, socket, character or block device
		if err := unix.Mknod(dst, st.Mode, int(st.Rdev)); err != nil {
			return &fs.PathError{Op: "mknod", Path: dst, Err: err}
		}
	}
	return setAttributes(src, dst, &st)
}

// copyFile copies a regular file's contents, data segment by data segment, so that holes in
// a sparse file stay holes (Ferry's tests look at sparse files; io.Copy would fill them).
func copyFile(src, dst string, size int64) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = copyData(in, out, size)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("copying %s: %w", src, err)
	}
	return nil
}

func copyData(in, out *os.File, size int64) error {
	for off := int64(0); off < size; {
		data, err := in.Seek(off, unix.SEEK_DATA)
		if errors.Is(err, syscall.ENXIO) {
			break // only a hole is left
		}
		if errors.Is(err, syscall.EINVAL) {
			data = off // the filesystem cannot tell: copy everything
		} else if err != nil {
			return err
		}
		hole, err := in.Seek(data, unix.SEEK_HOLE)
		if err != nil || hole > size || hole <= data {
			// Cannot tell, or the file changed under us: copy the rest as it reads.
			hole = size
		}
		if _, err := in.Seek(data, io.SeekStart); err != nil {
			return err
		}
		if _, err := out.Seek(data, io.SeekStart); err != nil {
			return err
		}
		// io.CopyN between two files uses copy_file_range.
		if _, err := io.CopyN(out, in, hole-data); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		off = hole
	}
	// A trailing hole, and the size as it was when the file was looked at.
	return out.Truncate(size)
}

// setAttributes gives dst src's owner, extended attributes, mode and times, in that order:
// chown clears the set-user-ID and set-group-ID bits and security.capability, and every
// other change would move the times.
func setAttributes(src, dst string, st *unix.Stat_t) error {
	if err := unix.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return &fs.PathError{Op: "lchown", Path: dst, Err: err}
	}
	if err := copyXattrs(src, dst); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK { // a symlink has no mode of its own on Linux
		if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
			return &fs.PathError{Op: "chmod", Path: dst, Err: err}
		}
	}
	times := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, times, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &fs.PathError{Op: "utimensat", Path: dst, Err: err}
	}
	return nil
}

func copyXattrs(src, dst string) error {
	names, err := xattrNames(src)
	if err != nil {
		return err
	}
	for _, name := range names {
		value, err := xattr(src, name)
		if errors.Is(err, unix.ENODATA) {
			continue // removed since it was listed
		}
		if err != nil {
			return err
		}
		if err := unix.Lsetxattr(dst, name, value, 0); err != nil {
			return &fs.PathError{Op: "lsetxattr " + name, Path: dst, Err: err}
		}
	}
	return nil
}

// xattrNames lists path's extended attributes (none where the filesystem has no support).
func xattrNames(path string) ([]string, error) {
	buf, err := growRead(func(b []byte) (int, error) { return unix.Llistxattr(path, b) })
	if errors.Is(err, unix.ENOTSUP) {
		return nil, nil
	}
	if err != nil {
		return nil, &fs.PathError{Op: "llistxattr", Path: path, Err: err}
	}
	var names []string
	for len(buf) > 0 {
		i := 0
		for i < len(buf) && buf[i] != 0 {
			i++
		}
		if i > 0 {
			names = append(names, string(buf[:i]))
		}
		if i < len(buf) {
			i++
		}
		buf = buf[i:]
	}
	return names, nil
}

func xattr(path, name string) ([]byte, error) {
	v, err := growRead(func(b []byte) (int, error) { return unix.Lgetxattr(path, name, b) })
	if err != nil && !errors.Is(err, unix.ENODATA) {
		err = &fs.PathError{Op: "lgetxattr " + name, Path: path, Err: err}
	}
	return v, err
}

// growRead calls read with a buffer of the size it asks for (a call with an empty buffer
// returns the size), again if the value grew in between (ERANGE).
func growRead(read func([]byte) (int, error)) ([]byte, error) {
	for range 5 {
		n, err := read(nil)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, nil
		}
		buf := make([]byte, n)
		n, err = read(buf)
		if errors.Is(err, unix.ERANGE) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
	return nil, unix.ERANGE
}

// treeSize is the apparent size of the regular files under root, each inode counted once.
func treeSize(root string) (int64, error) {
	seen := map[inode]bool{}
	var total int64
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return &fs.PathError{Op: "lstat", Path: path, Err: err}
		}
		if key := (inode{uint64(st.Dev), st.Ino}); !seen[key] {
			seen[key] = true
			total += st.Size
		}
		return nil
	})
	return total, err
}
