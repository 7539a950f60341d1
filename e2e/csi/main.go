// Command ferry-csi is a small but real CSI driver for Ferry's end-to-end tests: volumes are
// directories, snapshots are copies of them, and the kubelet finds it through its plugin
// registration socket (see README.md). It runs as one host process.
package main

import (
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// version is what GetPluginInfo reports; e2e/tools/install.sh sets it to the source hash.
var version = "dev"

func main() {
	var cfg config
	var capacity string
	flag.StringVar(&cfg.DriverName, "driver-name", "csi.ferry.dev", "CSI driver name (the CSIDriver object's and StorageClass provisioner's name)")
	flag.StringVar(&cfg.NodeID, "node-id", "", "this node's ID, as NodeGetInfo reports it (required)")
	flag.StringVar(&cfg.CSISocket, "csi-socket", "", "absolute path of the CSI unix socket to serve (required), e.g. /var/lib/kubelet/plugins/csi.ferry.dev/csi.sock")
	flag.StringVar(&cfg.RegistrationDir, "registration-dir", "", "the kubelet's plugins_registry directory; when set, serve the kubelet's registration service on <dir>/<driver-name>-reg.sock")
	flag.StringVar(&cfg.DataDir, "data-dir", "", "where volumes (<dir>/volumes/<id>) and snapshots (<dir>/snapshots/<id>) live (required)")
	flag.StringVar(&cfg.TopologyKey, "topology-key", "", "topology segment key, e.g. topology.csi.ferry.dev/node; volumes are then accessible only where it has --topology-value")
	flag.StringVar(&cfg.TopologyValue, "topology-value", "", "topology segment value (default: --node-id)")
	flag.StringVar(&capacity, "capacity", "", "total bytes all volumes may claim, e.g. 10Gi (default: unlimited)")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println("ferry-csi", version)
		return
	}

	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	log.SetPrefix("ferry-csi: ")
	if err := cfg.finish(capacity); err != nil {
		fmt.Fprintln(os.Stderr, "ferry-csi:", err)
		flag.Usage()
		os.Exit(2)
	}

	d := newDriver(cfg)
	// The kubelet refusing the registration is fatal, as for node-driver-registrar: a
	// supervisor restarting the driver is the way out, not a driver that looks healthy.
	regFailed := make(chan error, 1)
	d.onRegistrationFailed = func(err error) {
		select {
		case regFailed <- err:
		default:
		}
	}
	s, err := start(d)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("%s %s serving on %s (node %s, data %s)", cfg.DriverName, version, cfg.CSISocket, cfg.NodeID, cfg.DataDir)

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	code := 0
	select {
	case sig := <-sigs:
		log.Printf("%v: removing the sockets and exiting", sig)
	case err := <-s.errs:
		log.Printf("gRPC server failed: %v", err)
		code = 1
	case err := <-regFailed:
		log.Printf("exiting: %v", err)
		code = 1
	}
	s.stop()
	os.Exit(code)
}

// finish checks the flags and fills in defaults.
func (c *config) finish(capacity string) error {
	switch {
	case c.DriverName == "" || strings.ContainsRune(c.DriverName, '/'):
		return fmt.Errorf("--driver-name %q: must be non-empty and contain no '/'", c.DriverName)
	case c.NodeID == "":
		return errors.New("--node-id is required")
	case !filepath.IsAbs(c.CSISocket):
		// The kubelet dials the endpoint GetInfo returns from its own working directory.
		return fmt.Errorf("--csi-socket %q: an absolute path is required", c.CSISocket)
	case c.RegistrationDir != "" && !filepath.IsAbs(c.RegistrationDir):
		return fmt.Errorf("--registration-dir %q: must be an absolute path", c.RegistrationDir)
	case c.DataDir == "":
		return errors.New("--data-dir is required")
	case c.TopologyKey == "" && c.TopologyValue != "":
		return errors.New("--topology-value needs --topology-key")
	}
	if c.TopologyKey != "" && c.TopologyValue == "" {
		c.TopologyValue = c.NodeID
	}
	dir, err := filepath.Abs(c.DataDir)
	if err != nil {
		return err
	}
	c.DataDir = dir
	if capacity != "" {
		n, err := parseBytes(capacity)
		if err != nil || n <= 0 {
			return fmt.Errorf("--capacity %q: want a positive number of bytes, e.g. 1073741824 or 1Gi", capacity)
		}
		c.Capacity = n
	}
	return nil
}

// parseBytes reads a byte count with an optional Kubernetes-style suffix (k, M, G, T, or
// Ki, Mi, Gi, Ti).
func parseBytes(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{
		{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
		{"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12},
	}
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, err
	}
	if n > (1<<63-1)/mult {
		return 0, errors.New("too large")
	}
	return n * mult, nil
}
