//! What the operator and the agents say to each other about one shard of a job: its state,
//! which part of the tree it is, and the names of what it leaves on the destination. Both
//! sides use these types; no literal of them exists anywhere else.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Directory on the destination that holds the manifests and resume state. Reserved: no job
/// may read or write it as data.
pub const STATE_DIR: &str = ".ferry";

wire_enum! {
    /// Where a shard is in its life. The agent running it writes every state but `Failed` by
    /// `NodeUnavailable`, which the operator writes for an agent that never came back.
    #[derive(Default)]
    pub enum ShardState {
        /// Not started (also how a shard with no state yet reads).
        #[default]
        Pending,
        /// An agent is copying it.
        Running,
        /// Stopped by `suspend`; resumes where it stopped.
        Suspended,
        /// Stopped because the job is being deleted.
        Stopped,
        /// Every entry copied.
        Succeeded,
        /// Finished with failures (see the shard's failures).
        Failed,
    }
}

impl ShardState {
    /// Succeeded or Failed: nothing more will happen to it.
    pub fn finished(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }

    /// Nothing more will run it on this assignment: finished, or stopped for a deletion.
    pub fn over(self) -> bool {
        self.finished() || self == Self::Stopped
    }
}

/// Which entries of the tree a shard copies. A tree on a filesystem several nodes mount can
/// be split into parts that agents copy at the same time, then finished by one
/// `Directories` run. On the wire (a CopyJob's `status.shards[].part`) it is `""`, `"i/n"`
/// or `"directories"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Part {
    /// The whole tree.
    #[default]
    All,
    /// The non-directory entries whose path from the top hashes to `index` modulo `count`
    /// (a hard-linked file by its inode instead, so a link group stays in one part).
    /// Directories are created in place by every part that needs them and left without
    /// their metadata: the `Directories` run after all parts applies it.
    Slice { index: u32, count: u32 },
    /// Create missing directories and give every directory the source's metadata; copy
    /// nothing else; join the parts' manifests. The last step of a split copy.
    Directories,
}

const DIRECTORIES: &str = "directories";

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Part::All => Ok(()),
            Part::Slice { index, count } => write!(f, "{index}/{count}"),
            Part::Directories => f.write_str(DIRECTORIES),
        }
    }
}

impl FromStr for Part {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad =
            || format!("unknown part {s:?}: expected \"\", \"i/n\" with i < n, or {DIRECTORIES:?}");
        match s {
            "" => Ok(Part::All),
            DIRECTORIES => Ok(Part::Directories),
            _ => {
                let (i, n) = s.split_once('/').ok_or_else(bad)?;
                let (index, count) = (i.parse().map_err(|_| bad())?, n.parse().map_err(|_| bad())?);
                if index < count {
                    Ok(Part::Slice { index, count })
                } else {
                    Err(bad())
                }
            }
        }
    }
}

impl TryFrom<String> for Part {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<Part> for String {
    fn from(p: Part) -> String {
        p.to_string()
    }
}

/// The names a job's checksum manifests have under [`STATE_DIR`] on the destination.
/// Keyed by the job's uid, which only the API server hands out and never reuses: a job
/// re-created under the same name, or one in another namespace whose `<namespace>-<name>`
/// reads the same, never meets another job's files. (These are the tenant's copies of the
/// manifest, for `xxh128sum -c`; nothing Ferry decides is read back from them.)
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestName {
    base: String,
}

impl ManifestName {
    pub fn new(uid: &str) -> Self {
        Self {
            base: uid.to_string(),
        }
    }

    /// The job's uid: also what its staging names and its state on the node are keyed by.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The job's manifest, as `status.manifest` names it (relative to the destination
    /// root's `.ferry/`): `<uid>.xxh128`.
    pub fn joined(&self) -> String {
        format!("{}.xxh128", self.base)
    }

    /// The manifest a run of `part` writes: the joined one for a whole-tree shard, its own
    /// `<uid>.part-<i>.xxh128` for a slice, none for the directories pass (which joins
    /// the slices' into the job's).
    pub fn for_part(&self, part: Part) -> Option<String> {
        match part {
            Part::All => Some(self.joined()),
            Part::Slice { index, .. } => Some(self.part(index)),
            Part::Directories => None,
        }
    }

    /// Slice `index`'s manifest: `<uid>.part-<index>.xxh128`.
    pub fn part(&self, index: u32) -> String {
        format!("{}.part-{index}.xxh128", self.base)
    }

    /// The temporary name a manifest is written under before its rename.
    pub fn tmp(&self, name: &str) -> String {
        format!(".{name}.tmp")
    }

    /// `status.manifest`: `.ferry/<uid>.xxh128`.
    pub fn status_path(&self) -> String {
        format!("{STATE_DIR}/{}", self.joined())
    }
}

/// Whether a relative path (a CopyJob's `source.path` or `destination.path`) names
/// [`STATE_DIR`] or something in it: its first component, after empty and `.` ones.
/// Reserved: Ferry's state at the top of a root or volume is no tenant's to read or write.
pub fn in_state_dir(path: &str) -> bool {
    path.split('/').find(|c| !c.is_empty() && *c != ".") == Some(STATE_DIR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_round_trips_through_its_wire_form() {
        for p in [
            Part::All,
            Part::Directories,
            Part::Slice {
                index: 3,
                count: 16,
            },
        ] {
            assert_eq!(p.to_string().parse::<Part>(), Ok(p));
            let json = serde_json::to_string(&p).expect("serialize");
            assert_eq!(serde_json::from_str::<Part>(&json).expect("parse"), p);
        }
        assert_eq!(
            Part::Slice {
                index: 3,
                count: 16
            }
            .to_string(),
            "3/16"
        );
        for bad in ["16/16", "a/2", "3", "dirs", "-1/2"] {
            assert!(bad.parse::<Part>().is_err(), "{bad}");
        }
    }

    #[test]
    fn manifest_names_of_a_job_and_its_parts() {
        let m = ManifestName::new("0d6e-uid");
        assert_eq!(m.for_part(Part::All).as_deref(), Some("0d6e-uid.xxh128"));
        let part = m.for_part(Part::Slice { index: 7, count: 8 });
        assert_eq!(part.as_deref(), Some("0d6e-uid.part-7.xxh128"));
        assert_eq!(m.for_part(Part::Directories), None);
        assert_eq!(m.status_path(), ".ferry/0d6e-uid.xxh128");
    }

    #[test]
    fn paths_into_the_state_directory_are_recognised_however_written() {
        for p in [
            ".ferry",
            ".ferry/x",
            "./.ferry",
            ".//.ferry/",
            "./././.ferry/a/b",
        ] {
            assert!(in_state_dir(p), "{p:?}");
        }
        for p in ["", ".", "a/.ferry", ".ferry2", ".ferryx/y", "..ferry", "x"] {
            assert!(!in_state_dir(p), "{p:?}");
        }
    }

    #[test]
    fn a_shard_without_a_state_reads_as_pending() {
        #[derive(Deserialize)]
        struct S {
            #[serde(default)]
            state: ShardState,
        }
        let s: S = serde_json::from_str("{}").expect("parse");
        assert_eq!(s.state, ShardState::Pending);
    }
}
