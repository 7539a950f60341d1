//! The first frame on the peering port ([`crate::Frame::ExportHello`]): a reader from
//! another install asks for one export, with the credential the export's Secret holds, and
//! says which of its jobs asks (the job's uid and namespace, its shard and epoch) and which
//! path beneath the export it wants. The sender answers [`crate::Frame::Welcome`] or
//! [`crate::Frame::Refused`], then serves the path as it serves a shard's source between
//! nodes. Every field is bounded and checked here; what it may reach is the agent's.

use crate::codec::{Reader, Writer};
use crate::fields::{path, write_path, JOB_MAX};
use crate::Error;

/// Longest namespace name (a DNS label).
pub const NAMESPACE_MAX: usize = 63;

/// A reader's request for an export.
#[derive(Clone, PartialEq, Eq)]
pub struct ExportHello {
    pub version: u16,
    /// The CopyExport's uid, as its Secret says.
    pub export: Vec<u8>,
    /// The credential, as its Secret says.
    pub credential: [u8; 32],
    /// The reading job's uid and namespace (in the reader's cluster), its shard and epoch.
    pub job: Vec<u8>,
    pub namespace: Vec<u8>,
    pub shard: u32,
    pub epoch: u64,
    /// Beneath the export's source ("" for all of it): relative, no `..`.
    pub path: Vec<u8>,
    /// The reading job's `transfer.bandwidthLimit`, bytes a second (0: none): the serving
    /// side sends no faster (nor faster than the export's own limit).
    pub bandwidth_limit: u64,
}

impl std::fmt::Debug for ExportHello {
    // Never the credential.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExportHello")
            .field("version", &self.version)
            .field("export", &String::from_utf8_lossy(&self.export))
            .field("job", &String::from_utf8_lossy(&self.job))
            .field("namespace", &String::from_utf8_lossy(&self.namespace))
            .field("shard", &self.shard)
            .field("epoch", &self.epoch)
            .field("path", &String::from_utf8_lossy(&self.path))
            .field("bandwidth_limit", &self.bandwidth_limit)
            .finish_non_exhaustive()
    }
}

impl ExportHello {
    pub(crate) fn encode(&self, w: &mut Writer) -> Result<(), Error> {
        Error::at_most("export", self.export.len(), JOB_MAX)?;
        Error::at_most("job", self.job.len(), JOB_MAX)?;
        Error::at_most("namespace", self.namespace.len(), NAMESPACE_MAX)?;
        w.u16(self.version);
        w.bytes(&self.export);
        w.buf.extend_from_slice(&self.credential);
        w.bytes(&self.job);
        w.bytes(&self.namespace);
        w.u32(self.shard);
        w.u64(self.epoch);
        w.u64(self.bandwidth_limit);
        write_path(w, &self.path)
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, Error> {
        Ok(ExportHello {
            version: r.u16("version")?,
            export: r.bytes(JOB_MAX, "export")?.to_vec(),
            credential: r.array("credential")?,
            job: r.bytes(JOB_MAX, "job")?.to_vec(),
            namespace: r.bytes(NAMESPACE_MAX, "namespace")?.to_vec(),
            shard: r.u32("shard")?,
            epoch: r.u64("epoch")?,
            bandwidth_limit: r.u64("bandwidth limit")?,
            path: path(r)?,
        })
    }
}
