//! The copy policies, one set for the CopyJob API, the `ferry-agent copy` CLI and the
//! engine, with one set of defaults: what a CopyJob leaves unset, the CLI leaves unset and
//! `Options::default()` in the engine are the same thing.
//!
//! Each enum is spelled `PascalCase` in the API (`IfChanged`) and `kebab-case` on the
//! command line (`if-changed`); [`Policy::parse`] takes either.

use serde::{Deserialize, Serialize};

/// A policy enum that can be named on a command line.
pub trait Policy: Sized + Copy + 'static {
    /// Every value, in documentation order.
    const ALL: &'static [Self];
    /// The API's spelling (`IfChanged`).
    fn api_name(self) -> &'static str;
    /// The command line's spelling (`if-changed`).
    fn cli_name(self) -> &'static str;
    /// Either spelling, any case.
    fn parse(s: &str) -> Option<Self> {
        Self::ALL
            .iter()
            .copied()
            .find(|v| s.eq_ignore_ascii_case(v.api_name()) || s.eq_ignore_ascii_case(v.cli_name()))
    }
}

/// [`Policy`] for a `wire_enum!` (which gives the API's names), with the command line's.
macro_rules! policy {
    ($t:ident { $($v:ident => $cli:literal),+ $(,)? }) => {
        impl Policy for $t {
            const ALL: &'static [Self] = $t::ALL;
            fn api_name(self) -> &'static str {
                self.as_str()
            }
            fn cli_name(self) -> &'static str {
                match self { $(Self::$v => $cli),+ }
            }
        }
    };
}

wire_enum! {
    /// Whether data may be shared with the source by reflink (`FICLONE`) instead of copied.
    #[derive(Default)]
    pub enum Reflink {
        /// Clone where the filesystems allow it, copy otherwise.
        #[default]
        Auto,
        /// Clone or fail the file: for callers that rely on O(metadata) copies.
        Always,
        /// Never share blocks. Also avoids `copy_file_range` on filesystems where it clones
        /// implicitly (XFS, btrfs, NFS), so the destination owns its own blocks.
        Never,
    }
}
policy!(Reflink { Auto => "auto", Always => "always", Never => "never" });

wire_enum! {
    /// How copied files are checked against their source.
    #[derive(Default)]
    pub enum Verify {
        /// No check beyond the byte counts of each call.
        None,
        /// Hash (xxHash3-128) the source bytes as they are read and the destination bytes after
        /// writing (from the page cache); a difference fails the file.
        #[default]
        Checksum,
        /// As Checksum, with the destination flushed (`fdatasync`) and evicted from the page
        /// cache before it is re-read, so the bytes come from the medium.
        Full,
    }
}
policy!(Verify { None => "none", Checksum => "checksum", Full => "full" });

wire_enum! {
    /// What happens to entries the destination already has (only possible when copying into an
    /// existing directory).
    #[derive(Default)]
    pub enum Overwrite {
        /// Keep them; the source entry is skipped and counted.
        #[default]
        Never,
        /// Replace them unless they are regular files of the source's size and mtime.
        IfChanged,
        /// Replace them (by rename: a link at that name is replaced, never written through).
        Always,
    }
}
policy!(Overwrite { Never => "never", IfChanged => "if-changed", Always => "always" });

wire_enum! {
    /// How `overwrite: IfChanged` tells that an entry the destination has is not the
    /// source's.
    #[derive(Default)]
    pub enum Compare {
        /// Type, size and mtime (rsync's quick check): reads no data.
        #[default]
        SizeAndTime,
        /// Regular files of the source's size are read on both sides and compared by
        /// xxHash3-128 (rsync's `--checksum`): a change that kept size and mtime is copied;
        /// a file found equal is kept, listed in the manifest, and given the source's
        /// mode, owner and times where they differ. Other entries: the quick check.
        Checksum,
    }
}
policy!(Compare { SizeAndTime => "size-and-time", Checksum => "checksum" });

fn yes() -> bool {
    true
}

/// Metadata carried over; everything is on by default, as `cp -a` does.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "k8s", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Preserve {
    /// Permission bits including setuid, setgid and sticky (off: `mode & 0777 & !umask`).
    #[serde(default = "yes")]
    pub permissions: bool,
    /// Owner and group (needs root or CAP_CHOWN; quietly kept as-is otherwise, like `cp -a`).
    #[serde(default = "yes")]
    pub ownership: bool,
    /// atime and mtime in nanoseconds, on files, directories and symlinks.
    #[serde(default = "yes")]
    pub timestamps: bool,
    /// Extended attributes, POSIX ACLs included (they are `system.posix_acl_*` xattrs).
    #[serde(default = "yes")]
    pub xattrs: bool,
    /// Hard links stay hard links: entries sharing an inode in the source share one in the
    /// destination.
    #[serde(default = "yes")]
    pub hard_links: bool,
    /// Holes in sparse files stay holes.
    #[serde(default = "yes")]
    pub sparseness: bool,
}

impl Default for Preserve {
    fn default() -> Self {
        Self::ALL
    }
}

impl Preserve {
    pub const ALL: Self = Self {
        permissions: true,
        ownership: true,
        timestamps: true,
        xattrs: true,
        hard_links: true,
        sparseness: true,
    };
    pub const NONE: Self = Self {
        permissions: false,
        ownership: false,
        timestamps: false,
        xattrs: false,
        hard_links: false,
        sparseness: false,
    };

    /// The names [`Preserve::without`] takes, in documentation order (the API's field
    /// names in kebab-case).
    pub const NAMES: [&'static str; 6] = [
        "permissions",
        "ownership",
        "timestamps",
        "xattrs",
        "hard-links",
        "sparseness",
    ];

    /// Turn off one kind of metadata by name: one of [`Preserve::NAMES`], the API's
    /// camelCase spelling, the short names `ferry-agent copy` took before (`mode`, `owner`,
    /// `xattr`, `links`, `sparse`), or `all`. `None` for an unknown name.
    pub fn without(mut self, name: &str) -> Option<Self> {
        match name {
            "permissions" | "mode" => self.permissions = false,
            "ownership" | "owner" => self.ownership = false,
            "timestamps" => self.timestamps = false,
            "xattrs" | "xattr" => self.xattrs = false,
            "hard-links" | "hardLinks" | "links" => self.hard_links = false,
            "sparseness" | "sparse" => self.sparseness = false,
            "all" => self = Self::NONE,
            _ => return None,
        }
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn either_spelling_names_a_policy() {
        assert_eq!(Overwrite::parse("if-changed"), Some(Overwrite::IfChanged));
        assert_eq!(Overwrite::parse("IfChanged"), Some(Overwrite::IfChanged));
        assert_eq!(Verify::parse("FULL"), Some(Verify::Full));
        assert_eq!(Reflink::parse("sometimes"), None);
    }

    #[test]
    fn every_preserve_name_turns_one_field_off() {
        for name in Preserve::NAMES {
            let p = Preserve::ALL.without(name).expect("a listed name");
            assert_ne!(p, Preserve::ALL, "{name}");
            assert_eq!(p.without("all"), Some(Preserve::NONE));
        }
        assert_eq!(Preserve::ALL.without("colour"), None);
    }
}

wire_enum! {
    /// Source claims only: how the claim is read. Direct (the default): the live volume.
    /// Snapshot: the operator takes a `VolumeSnapshot` of it first, restores that to a
    /// temporary claim and copies from it, so the copy is one point in time even while an
    /// application writes; both are deleted afterwards (but a raw block claim's snapshot
    /// is kept as the destination claim's base for changed-block tracking, when that is on).
    #[derive(Default)]
    pub enum CopyMethod {
        /// The live volume, through a pod that mounts it.
        #[default]
        Direct,
        /// A `VolumeSnapshot` the operator takes first, restored to a temporary claim: one
        /// point in time, whatever writes to the claim meanwhile.
        Snapshot,
    }
}
