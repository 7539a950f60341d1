package main

// Block volumes are files; the node service shows each as a loop device, attached when the
// volume is staged and detached when it is unstaged, with ioctls (no losetup binary).

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// loopMarker is the file in a block volume's staging directory that names its loop device.
const loopMarker = "loop"

// attachLoop attaches file to a free loop device and returns the device's path.
func attachLoop(file string) (string, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return "", err
	}
	defer ctl.Close()
	back, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		return "", err
	}
	defer back.Close()
	// Another process may take the free device between asking and configuring it: ask again.
	for range 10 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", fmt.Errorf("LOOP_CTL_GET_FREE: %w", err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		f, err := os.OpenFile(dev, os.O_RDWR, 0)
		if err != nil {
			return "", err
		}
		cfg := unix.LoopConfig{Fd: uint32(back.Fd())}
		copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], file)
		err = unix.IoctlLoopConfigure(int(f.Fd()), &cfg)
		f.Close()
		if errors.Is(err, unix.EBUSY) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("LOOP_CONFIGURE %s on %s: %w", dev, file, err)
		}
		return dev, nil
	}
	return "", fmt.Errorf("no free loop device for %s after 10 tries", file)
}

// detachLoop detaches a loop device; one already detached is fine.
func detachLoop(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("LOOP_CLR_FD %s: %w", dev, err)
	}
	return nil
}

// stagedLoop is the loop device a staging directory names, if any.
func stagedLoop(staging string) (string, bool, error) {
	b, err := os.ReadFile(filepath.Join(staging, loopMarker))
	if errors.Is(err, os.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	dev := strings.TrimSpace(string(b))
	if !strings.HasPrefix(dev, "/dev/loop") {
		return "", false, fmt.Errorf("%s names %q, not a loop device", filepath.Join(staging, loopMarker), dev)
	}
	return dev, true, nil
}
