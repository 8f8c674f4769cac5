//! Where flotilla's keys live in etcd: every key of column family `cf`
//! is `<prefix><cf>/<key bytes>`, so byte order within a column family is
//! the store's key order, and two installations with different prefixes
//! share one etcd without seeing each other. Control keys (the leader's,
//! the redo record of a batch too large for one transaction) start with
//! `<prefix>_`, which no column family name does.

/// The keys of one installation.
#[derive(Debug, Clone)]
pub struct Layout {
    prefix: Vec<u8>,
}

impl Layout {
    /// `prefix` must be non-empty; a trailing `/` is added when missing.
    pub fn new(prefix: &str) -> Layout {
        let mut p = prefix.as_bytes().to_vec();
        if p.last() != Some(&b'/') {
            p.push(b'/');
        }
        Layout { prefix: p }
    }

    /// The installation's prefix, as given (with its `/`).
    pub fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// Where the keys of `cf` start.
    pub fn cf_prefix(&self, cf: &str) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.prefix.len() + cf.len() + 1);
        k.extend_from_slice(&self.prefix);
        k.extend_from_slice(cf.as_bytes());
        k.push(b'/');
        k
    }

    /// The etcd key of `key` in `cf`.
    pub fn key(&self, cf: &str, key: &[u8]) -> Vec<u8> {
        let mut k = self.cf_prefix(cf);
        k.extend_from_slice(key);
        k
    }

    /// The store key of an etcd key, with its column family (`None` for a
    /// key outside every column family: another prefix, a control key).
    pub fn split<'k>(&self, etcd_key: &'k [u8], cfs: &[&'static str]) -> Option<(&'static str, &'k [u8])> {
        let rest = etcd_key.strip_prefix(&self.prefix[..])?;
        let slash = rest.iter().position(|b| *b == b'/')?;
        let cf = cfs.iter().find(|c| c.as_bytes() == &rest[..slash])?;
        Some((cf, &rest[slash + 1..]))
    }

    /// The leader's key (lease-bound; its create revision is the term).
    pub fn leader(&self) -> Vec<u8> {
        self.control("leader")
    }

    /// Where the redo record of an oversized batch starts.
    pub fn redo_prefix(&self) -> Vec<u8> {
        self.control("redo/")
    }

    /// The redo record's head: written last, it makes the batch committed.
    pub fn redo_head(&self) -> Vec<u8> {
        self.control("redo/head")
    }

    /// The redo record's chunk `i`.
    pub fn redo_chunk(&self, i: u32) -> Vec<u8> {
        let mut k = self.control("redo/chunk/");
        k.extend_from_slice(&i.to_be_bytes());
        k
    }

    /// Put by a master that won, once its store is open: followers see it
    /// arrive through their watch (what it waits for before it boots from
    /// its view: every write before it has arrived too).
    pub fn took_over(&self) -> Vec<u8> {
        self.control("took_over")
    }

    /// Where each master of the installation names itself (`<name>` after it).
    pub fn masters(&self) -> Vec<u8> {
        self.control("masters/")
    }

    /// The secret masters present to each other (package blobs).
    pub fn peer_secret(&self) -> Vec<u8> {
        self.control("peer_secret")
    }

    fn control(&self, name: &str) -> Vec<u8> {
        let mut k = self.prefix.clone();
        k.push(b'_');
        k.extend_from_slice(name.as_bytes());
        k
    }
}

/// The first key after every key starting with `prefix` (etcd's
/// `range_end` for a prefix); `[0]` ("to the end of the keyspace") when
/// the prefix is all `0xff` or empty.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_their_order_and_split_back() {
        let l = Layout::new("/flotilla");
        let cfs = ["clusters", "cluster_ops", "events"];
        let a = l.key("clusters", b"a");
        let b = l.key("clusters", &[0xff, 0]);
        assert!(a < b);
        assert_eq!(l.split(&b, &cfs), Some(("clusters", &[0xff, 0][..])));
        // A longer column family name never falls inside a shorter one's range.
        let ops = l.key("cluster_ops", b"x");
        assert!(!ops.starts_with(&l.cf_prefix("clusters")));
        assert_eq!(l.split(&ops, &cfs), Some(("cluster_ops", &b"x"[..])));
        assert_eq!(l.split(&l.leader(), &cfs), None);
        assert_eq!(l.split(b"/other/clusters/a", &cfs), None);
        assert_eq!(Layout::new("/f/").prefix(), b"/f/");
    }

    #[test]
    fn prefix_end_is_the_first_key_past_the_prefix() {
        assert_eq!(prefix_end(b"ab"), b"ac".to_vec());
        assert_eq!(prefix_end(&[b'a', 0xff]), b"b".to_vec());
        assert_eq!(prefix_end(&[0xff, 0xff]), vec![0]);
        assert_eq!(prefix_end(b""), vec![0]);
    }
}
