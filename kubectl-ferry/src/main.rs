//! `kubectl ferry` (the binary `kubectl-ferry`, found by kubectl on the PATH): Ferry's
//! CopyJobs from the command line. `copy SRC DST` creates one and follows it with a live bar;
//! `get` and `watch` show files, bytes, rate and ETA; `why` says where a job is and what to
//! change; `verify` checks a destination against the manifest a copy wrote there (every
//! file read and hashed on its node; exit status 1 if any differs); `migrate` moves a claim to another StorageClass keeping its name (a
//! ClaimMigration, followed step by step); `completion` prints a bash or zsh completion script. It uses the user's
//! kubeconfig and nothing else: it creates and reads Ferry's objects as the user, and has
//! no privileges of its own.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{CommandFactory, Parser, Subcommand};
use ferry_crds::{
    ClaimMigration, ClaimMigrationSpec, Compare, CopyJob, CopyJobSpec, Overwrite, Verify,
};
use k8s_openapi::api::core::v1::Event;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client, ResourceExt};

mod endpoint;
mod follow;
mod migrate;
mod verify;
mod why;

/// Ferry's CopyJobs from kubectl.
#[derive(Debug, Parser)]
#[command(name = "kubectl-ferry", bin_name = "kubectl ferry", version)]
struct Cli {
    /// Namespace (default: the kubeconfig context's).
    #[arg(short, long, global = true)]
    namespace: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Copy SRC to DST with a CopyJob, and follow it to its end (exit status 1 if it fails).
    /// SRC and DST: NAME[:PATH] (a claim; also pvc:NAME[:PATH]), snapshot:NAME (a source
    /// only), root:NAME[:PATH] (a StorageRoot).
    Copy {
        src: String,
        dst: String,
        /// The CopyJob's name (default: one the API server makes, copy-XXXXX).
        #[arg(long)]
        name: Option<String>,
        /// None, Checksum or Full.
        #[arg(long, default_value = "Checksum", value_parser = parse_verify)]
        verify: Verify,
        /// What to do with entries the destination has: Never, IfChanged or Always.
        #[arg(long, default_value = "Never", value_parser = parse_overwrite)]
        overwrite: Overwrite,
        /// With --overwrite IfChanged: SizeAndTime or Checksum.
        #[arg(long, default_value = "SizeAndTime", value_parser = parse_compare)]
        compare: Compare,
        /// Copy only what matches (gitignore syntax; repeat for more).
        #[arg(long)]
        include: Vec<String>,
        /// Skip what matches (gitignore syntax; repeat for more).
        #[arg(long)]
        exclude: Vec<String>,
        /// Mirror: remove from DST what SRC lacks, after a copy without failures.
        #[arg(long)]
        delete_extraneous: bool,
        /// Plan only: count what would be copied.
        #[arg(long)]
        dry_run: bool,
        /// Create the job and return at once.
        #[arg(long)]
        detach: bool,
        /// Stop following after this many seconds (the job goes on).
        #[arg(long)]
        timeout: Option<u64>,
    },
    /// List CopyJobs with their phase, files, bytes, rate and ETA (one, if named).
    Get {
        job: Option<String>,
        /// In every namespace.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
    },
    /// Follow a CopyJob to its end with a live bar (exit status 1 if it fails).
    Watch {
        job: String,
        /// Stop following after this many seconds.
        #[arg(long)]
        timeout: Option<u64>,
    },
    /// Check a destination against the manifest a copy wrote there, with a CopyJob that
    /// copies nothing: every file it lists read and hashed on the destination's node. TARGET:
    /// a CopyJob (its destination, its status.manifest), or with --manifest a destination as
    /// `copy` writes DST. Exit status 0 when every file matches, 1 when any is changed,
    /// missing or not a regular file (they are listed).
    Verify {
        /// A CopyJob, or with --manifest a destination (CLAIM[:PATH] or root:NAME[:PATH]).
        #[arg(required_unless_present = "migration")]
        target: Option<String>,
        /// The manifest, as status.manifest names it (.ferry/UID.xxh128): TARGET is then a
        /// destination, for a copy whose job is gone.
        #[arg(long)]
        manifest: Option<String>,
        /// A ClaimMigration that succeeded: its claim checked against its final sync's
        /// manifest (status.manifest), instead of TARGET.
        #[arg(long, conflicts_with_all = ["target", "manifest"])]
        migration: Option<String>,
        /// The check job's name (default: TARGET-verify-XXXXX).
        #[arg(long)]
        name: Option<String>,
        /// Create the job and return at once.
        #[arg(long)]
        detach: bool,
        /// Stop following after this many seconds (the check goes on).
        #[arg(long)]
        timeout: Option<u64>,
    },
    /// Where a CopyJob is, why, and what to change: its conditions, failed paths and events.
    Why { job: String },
    /// Move CLAIM to another StorageClass keeping its name (a ClaimMigration): a live copy,
    /// its Deployments and StatefulSets scaled to zero for a final sync, the swap, and back.
    /// Exit status 0 when it is on the new volume, 1 when it failed (its users back on the
    /// old one).
    Migrate {
        claim: String,
        /// The StorageClass of the new volume.
        #[arg(long = "to-class")]
        to_class: String,
        /// The node for the new volume (a WaitForFirstConsumer class only).
        #[arg(long)]
        node: Option<String>,
        /// The ClaimMigration's name (default: CLAIM-migrate-XXXXX).
        #[arg(long)]
        name: Option<String>,
        /// Seconds the users get to stop before it rolls back (10 to 3600).
        #[arg(long, default_value_t = 300)]
        quiesce_timeout: i32,
        /// A suspended Job of yours (labelled ferry.dev/hook-for=NAME) the migration starts
        /// after the live copy, before the users are scaled to zero (needs --name).
        #[arg(long, requires = "name")]
        hook_before_scale_down: Option<String>,
        /// A suspended Job of yours (labelled ferry.dev/hook-for=NAME) the migration starts
        /// once the users are at zero, before the final sync (needs --name).
        #[arg(long, requires = "name")]
        hook_before_final_sync: Option<String>,
        /// Seconds each hook's Job gets to complete before the migration rolls back (10 to
        /// 3600).
        #[arg(long, default_value_t = 300)]
        hook_timeout: i32,
        /// Create it and return at once.
        #[arg(long)]
        detach: bool,
        /// Stop following after this many seconds (the migration goes on).
        #[arg(long)]
        timeout: Option<u64>,
    },
    /// Print a completion script: `source <(kubectl ferry completion bash)`, or for zsh
    /// `kubectl ferry completion zsh > "${fpath[1]}/_kubectl-ferry"`.
    Completion { shell: clap_complete::Shell },
}

fn parse_policy<T: serde::de::DeserializeOwned>(
    s: &str,
    what: &str,
    choices: &str,
) -> Result<T, String> {
    serde_json::from_value(serde_json::Value::String(s.to_string()))
        .map_err(|_| format!("{s:?} is no {what}: use one of {choices}"))
}

fn parse_verify(s: &str) -> Result<Verify, String> {
    parse_policy(s, "verification", "None, Checksum, Full")
}

fn parse_overwrite(s: &str) -> Result<Overwrite, String> {
    parse_policy(s, "overwrite policy", "Never, IfChanged, Always")
}

fn parse_compare(s: &str) -> Result<Compare, String> {
    parse_policy(s, "comparison", "SizeAndTime, Checksum")
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Cli::parse()).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kubectl ferry: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode> {
    if let Command::Completion { shell } = cli.command {
        let mut cmd = Cli::command();
        clap_complete::generate(shell, &mut cmd, "kubectl-ferry", &mut std::io::stdout());
        return Ok(ExitCode::SUCCESS);
    }
    let client = Client::try_default()
        .await
        .context("no cluster to talk to: set KUBECONFIG or a kubeconfig context")?;
    let ns = cli
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let jobs = Api::<CopyJob>::namespaced(client.clone(), &ns);
    match cli.command {
        Command::Copy {
            src,
            dst,
            name,
            verify,
            overwrite,
            compare,
            include,
            exclude,
            delete_extraneous,
            dry_run,
            detach,
            timeout,
        } => {
            let mut spec: CopyJobSpec = serde_json::from_value(serde_json::json!({
                "source": endpoint::parse(&src, true)?,
                "destination": endpoint::parse(&dst, false)?,
            }))?;
            spec.verify = verify;
            spec.overwrite = overwrite;
            spec.compare = compare;
            spec.include = include;
            spec.exclude = exclude;
            spec.delete_extraneous = delete_extraneous;
            spec.dry_run = dry_run;
            let mut job = CopyJob::new(name.as_deref().unwrap_or_default(), spec);
            if name.is_none() {
                job.metadata.name = None;
                job.metadata.generate_name = Some("copy-".into());
            }
            start(&client, &jobs, &ns, &job, detach, timeout).await
        }
        Command::Verify {
            target,
            manifest,
            migration,
            name,
            detach,
            timeout,
        } => {
            let (destination, check, head) = match (migration, target) {
                (Some(m), _) => {
                    let migrations = Api::<ClaimMigration>::namespaced(client.clone(), &ns);
                    let (d, c) = verify::migrated(&migrations, &m).await?;
                    (d, c, m)
                }
                (None, Some(t)) => {
                    let (d, c) = verify::target(&jobs, &t, manifest).await?;
                    (d, c, t)
                }
                (None, None) => unreachable!("clap requires TARGET or --migration"),
            };
            let job = verify::job(destination, check, name.as_deref(), &head)?;
            start(&client, &jobs, &ns, &job, detach, timeout).await
        }
        Command::Watch { job, timeout } => finish(&client, &jobs, &ns, &job, timeout).await,
        Command::Get {
            job,
            all_namespaces,
        } => {
            let list: Vec<CopyJob> = match (&job, all_namespaces) {
                (Some(j), _) => vec![jobs.get(j).await?],
                (None, true) => {
                    Api::<CopyJob>::all(client)
                        .list(&ListParams::default())
                        .await?
                        .items
                }
                (None, false) => jobs.list(&ListParams::default()).await?.items,
            };
            println!(
                "{:<16} {:<40} {:<10} PROGRESS",
                "NAMESPACE", "NAME", "PHASE"
            );
            for j in &list {
                let phase = j.status.as_ref().and_then(|s| s.phase).unwrap_or_default();
                println!(
                    "{:<16} {:<40} {:<10} {}",
                    j.namespace().unwrap_or_default(),
                    j.name_any(),
                    format!("{phase:?}"),
                    follow::numbers(j)
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Why { job } => {
            let j = jobs.get(&job).await?;
            let events = why::events_of(&Api::<Event>::namespaced(client, &ns), &job).await?;
            print!("{}", why::explain(&j, &events));
            Ok(ExitCode::SUCCESS)
        }
        Command::Migrate {
            claim,
            to_class,
            node,
            name,
            quiesce_timeout,
            hook_before_scale_down,
            hook_before_final_sync,
            hook_timeout,
            detach,
            timeout,
        } => {
            let hook = |job: Option<String>| {
                job.map(|job| serde_json::json!({"job": job, "timeoutSeconds": hook_timeout}))
            };
            let spec: ClaimMigrationSpec = serde_json::from_value(serde_json::json!({
                "claim": claim,
                "to": {"storageClassName": to_class, "node": node},
                "quiesceTimeoutSeconds": quiesce_timeout,
                "hooks": {
                    "beforeScaleDown": hook(hook_before_scale_down),
                    "beforeFinalSync": hook(hook_before_final_sync),
                },
            }))?;
            let mut m = ClaimMigration::new(name.as_deref().unwrap_or_default(), spec);
            if name.is_none() {
                m.metadata.name = None;
                // A name is at most 63 characters; the API server adds 5.
                let head: String = claim.chars().take(40).collect();
                m.metadata.generate_name = Some(format!("{head}-migrate-"));
            }
            let migrations = Api::<ClaimMigration>::namespaced(client, &ns);
            let made = migrations
                .create(&PostParams::default(), &m)
                .await
                .map_err(|e| match e {
                    kube::Error::Api(s) => {
                        anyhow::anyhow!("the API server refused the ClaimMigration: {}", s.message)
                    }
                    e => e.into(),
                })?;
            let name = made.name_any();
            println!("claimmigration.ferry.dev/{name} created in {ns}");
            if detach {
                return Ok(ExitCode::SUCCESS);
            }
            let (outcome, m) =
                migrate::follow(&migrations, &name, timeout.map(Duration::from_secs)).await?;
            match outcome {
                migrate::Outcome::Succeeded => {
                    println!("{name}: {}", migrate::line(&m));
                    if m.status.as_ref().is_some_and(|s| s.manifest.is_some()) {
                        println!("to check the claim against the final sync's manifest: kubectl ferry verify -n {ns} --migration {name}");
                    }
                    Ok(ExitCode::SUCCESS)
                }
                migrate::Outcome::Failed => {
                    eprintln!("{name}: {}", migrate::line(&m));
                    Ok(ExitCode::from(1))
                }
            }
        }
        Command::Completion { .. } => unreachable!("handled above"),
    }
}

/// Create `job` and say so, then (unless `detach`) follow it to its end. The API server's
/// refusal (its CEL rules) says what to change, so it is passed on.
async fn start(
    client: &Client,
    jobs: &Api<CopyJob>,
    ns: &str,
    job: &CopyJob,
    detach: bool,
    timeout: Option<u64>,
) -> Result<ExitCode> {
    let made = jobs
        .create(&PostParams::default(), job)
        .await
        .map_err(|e| match e {
            kube::Error::Api(s) => {
                anyhow::anyhow!("the API server refused the CopyJob: {}", s.message)
            }
            e => e.into(),
        })?;
    let name = made.name_any();
    println!("copyjob.ferry.dev/{name} created in {ns}");
    if detach {
        return Ok(ExitCode::SUCCESS);
    }
    finish(client, jobs, ns, &name, timeout).await
}

/// Follow `name` to its end; on failure print why. Exit status 0 Succeeded, 1 Failed.
async fn finish(
    client: &Client,
    jobs: &Api<CopyJob>,
    ns: &str,
    name: &str,
    timeout: Option<u64>,
) -> Result<ExitCode> {
    let outcome = follow::follow(jobs, name, timeout.map(Duration::from_secs)).await?;
    let job = jobs.get(name).await?;
    match outcome {
        follow::Outcome::Succeeded if job.spec.check.is_some() => {
            println!("copyjob.ferry.dev/{name} {}", verify::outcome(&job));
            Ok(ExitCode::SUCCESS)
        }
        follow::Outcome::Succeeded => {
            println!(
                "copyjob.ferry.dev/{name} succeeded: {}",
                follow::numbers(&job)
            );
            if let Some(m) = job.status.as_ref().and_then(|s| s.manifest.clone()) {
                println!("checksum manifest: {m} in the destination");
            }
            Ok(ExitCode::SUCCESS)
        }
        follow::Outcome::Failed => {
            let events =
                why::events_of(&Api::<Event>::namespaced(client.clone(), ns), name).await?;
            eprint!("{}", why::explain(&job, &events));
            Ok(ExitCode::from(1))
        }
    }
}
