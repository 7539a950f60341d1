//! The benchmark's two clusters ([`Clusters::start`]): east and west, each a control plane
//! with the chart rendered with peering on and its operator on the chart's token, each
//! trusting the other (`ferry_e2e::peering`); east's nodes east-a and east-b, west's west-a,
//! each node's `/srv/vol` a tmpfs and its agent on its own loopback address; east's export
//! of east-a's `src/` to west's namespace, its Secret carried to west as a tenant would;
//! an rsync daemon and an sshd on east-a's address; the wire counters on every server port.
//! The sending side (east-a's agent, the daemons) runs on one CPU and the receiving side
//! (east-b's and west-a's agents, the clients) on the other unless `NET_CPUS=shared`.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use ferry_e2e::peering::{carried_secret, install_on, let_the_operator_read, pair, WITHIN};
use ferry_e2e::{wait_for, workspace_bin, ControlPlane, Proc, ADVERTISED_WITHIN};

use super::measure::Wire;
use super::{Clusters, EAST_A, EAST_B, EXPORT, EXPORT_SECRET, READER, TEAM, WEST_A};
use crate::machine::Tmpfs;
use crate::network::cpus::Cpus;
use crate::network::rsync_daemon;
use crate::throughput::{ftzz, release_builds};

/// Each node's `/srv/vol`: east-a's holds the trees (2.5 GiB at most), east-b's one copy,
/// west-a's three. Pages are taken as written, not at mount.
const TMPFS_EAST_A: &str = "size=4G,nr_inodes=2M,mode=0755";
const TMPFS_EAST_B: &str = "size=4G,nr_inodes=2M,mode=0755";
const TMPFS_WEST_A: &str = "size=9G,nr_inodes=4M,mode=0755";

impl Clusters {
    pub(super) fn start() -> Result<Self> {
        release_builds();
        let helm = ferry_e2e::helm_or_skip()?
            .context("helm is missing: run e2e/tools/install.sh (make deps)")?;
        let cpus = Cpus::from_env()?;
        let ftzz = ftzz()?;
        // The binaries are built before either control plane starts.
        workspace_bin("ferry-agent", "ferry-agent")?;
        workspace_bin("ferry-operator", "ferry-operator")?;
        eprintln!("starting east and west (etcd, kube-apiserver, the chart with peering on) ...");
        let east = install_on(ControlPlane::start_required()?, &helm, None)?;
        let west = install_on(ControlPlane::start_required()?, &helm, Some("west"))?;
        let east_name = pair(&east, &west)?;
        eprintln!("east ({east_name}) and west trust each other");
        let mut operators = Vec::new();
        let (east, west) = {
            let (mut e, mut w) = (east, west);
            operators.extend(e.operator.take());
            operators.extend(w.operator.take());
            (e.cp, w.cp)
        };

        let east_a = east.add_node(EAST_A.0)?.join("srv/vol");
        let east_b = east.add_node(EAST_B.0)?.join("srv/vol");
        let west_a = west.add_node(WEST_A.0)?.join("srv/vol");
        let tmpfs = vec![
            Tmpfs::mount(&east_a, TMPFS_EAST_A)?,
            Tmpfs::mount(&east_b, TMPFS_EAST_B)?,
            Tmpfs::mount(&west_a, TMPFS_WEST_A)?,
        ];
        std::fs::create_dir_all(east_a.join("src"))?;

        east.kubectl_ok(&["create", "namespace", TEAM])?;
        west.kubectl_ok(&["create", "namespace", READER])?;
        for (cp, root, node, ns) in [
            (&east, "vol-a", EAST_A.0, TEAM),
            (&east, "vol-b", EAST_B.0, TEAM),
            (&west, "vol", WEST_A.0, READER),
        ] {
            cp.apply(&format!(
                "apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: {root}\nspec:\n  path: /srv/vol\n  nodeSelector: {{ferry.dev/node: {node}}}\n  namespaces: {{names: [{ns}]}}\n"
            ))?;
        }

        eprintln!("starting the agents (release) ...");
        let peering_port = ferry_e2e::free_port()?;
        let peering = format!("{}:{peering_port}", EAST_A.1);
        let west_peering = format!("{}:{}", WEST_A.1, ferry_e2e::free_port()?);
        let agents = [
            east.spawn_chart_agent(EAST_A.0, EAST_A.1, &[("FERRY_PEERING_LISTEN", &peering)])?,
            east.spawn_chart_agent(EAST_B.0, EAST_B.1, &[])?,
            west.spawn_chart_agent(
                WEST_A.0,
                WEST_A.1,
                &[("FERRY_PEERING_LISTEN", &west_peering)],
            )?,
        ];
        cpus.place(0, agents[0].id())?;
        cpus.place(1, agents[1].id())?;
        cpus.place(1, agents[2].id())?;
        let transfer = east.advertised_transfer_address(EAST_A.0, ADVERTISED_WITHIN)?;
        east.advertised_transfer_address(EAST_B.0, ADVERTISED_WITHIN)?;
        west.advertised_transfer_address(WEST_A.0, ADVERTISED_WITHIN)?;
        let transfer_port: u16 = transfer
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .with_context(|| format!("east-a's transfer address {transfer:?}"))?;

        // The export, as east's tenant makes it, and its Secret carried to west.
        east.apply(&format!(
            "apiVersion: ferry.dev/v1alpha1\nkind: CopyExport\nmetadata:\n  name: {EXPORT}\n  namespace: {TEAM}\nspec:\n  source: {{root: vol-a, path: src}}\n  readers: [{{peer: west, namespace: {READER}}}]\n  ttl: 24h\n"
        ))?;
        let mut seen = String::new();
        wait_for("the export Ready on east-a", WITHIN, || {
            seen = east
                .get(
                    &format!("copyexport/{EXPORT}"),
                    TEAM,
                    "{.status.conditions[?(@.type==\"Ready\")].status} {.status.address}",
                )
                .unwrap_or_default();
            seen == format!("True {peering}")
        })
        .with_context(|| format!("{seen}\n{}", east.log_tail("operator.log", 20)))?;
        west.apply(&carried_secret(&east, TEAM, EXPORT_SECRET, READER)?.to_string())?;
        let_the_operator_read(&west, READER, EXPORT_SECRET)?;

        eprintln!("starting an rsync daemon and sshd on east-a's address ...");
        let (rsyncd, rsync_port) = rsync_daemon(&east, &east_a.join("src"), EAST_A.1)?;
        let (sshd, ssh_port, ssh_key) = sshd(&east)?;
        cpus.place(0, rsyncd.id())?;
        cpus.place(0, sshd.id())?;
        let wire = Wire::start(&[peering_port, transfer_port, rsync_port, ssh_port])?;
        let server_pids = [rsyncd.id(), sshd.id()];
        Ok(Self {
            agents,
            _servers: vec![rsyncd, sshd],
            wire,
            _tmpfs: tmpfs,
            _operators: operators,
            east,
            west,
            east_a,
            east_b,
            west_a,
            ftzz,
            rsync_port,
            ssh_port,
            ssh_key,
            server_pids,
            peering_port,
            transfer_port,
            cpus,
        })
    }
}

/// An sshd on east-a's address that lets root in with a key made for the run (its own host
/// key, no password, no PAM, OpenSSH's default ciphers); it, its port and the client's key.
fn sshd(cp: &ControlPlane) -> Result<(Proc, u16, std::path::PathBuf)> {
    let dir = cp.dir().join("ssh");
    std::fs::create_dir_all(&dir)?;
    for key in ["host", "client"] {
        let path = dir.join(key);
        let out = Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(&path)
            .output()
            .context("run ssh-keygen")?;
        ensure!(
            out.status.success(),
            "ssh-keygen: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    std::fs::copy(dir.join("client.pub"), dir.join("authorized_keys"))?;
    // Its privilege separation directory, which a machine that never ran sshd lacks.
    std::fs::create_dir_all("/run/sshd")?;
    let port = ferry_e2e::free_port()?;
    let conf = dir.join("sshd_config");
    std::fs::write(
        &conf,
        format!(
            "Port {port}\nListenAddress {}\nHostKey {}\nAuthorizedKeysFile {}\nPermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPidFile {}\nSubsystem sftp internal-sftp\n",
            EAST_A.1,
            dir.join("host").display(),
            dir.join("authorized_keys").display(),
            dir.join("sshd.pid").display()
        ),
    )?;
    let sshd = cp.spawn(
        Path::new("/usr/sbin/sshd"),
        &["-D", "-e", "-f", &conf.to_string_lossy()],
        &[],
        "sshd.log",
    )?;
    ferry_e2e::wait_for("sshd", Duration::from_secs(10), || {
        std::net::TcpStream::connect((EAST_A.1, port)).is_ok()
    })?;
    Ok((sshd, port, dir.join("client")))
}
