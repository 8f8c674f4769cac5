//! Sharing the common strings of records decoded one by one.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::records::{Applied, InstanceRecord};

/// Makes records decoded one by one (a master's boot) share their common
/// strings again, as records placed together do: one copy per distinct
/// cluster, role, host, port name and `Applied` instead of one per instance.
#[derive(Default)]
pub struct SharedStrings {
    strings: HashSet<Arc<str>>,
    applied: HashMap<AppliedKey, Arc<Applied>>,
}

/// An `Applied` by its version and limits (the CPU limit by its bits).
/// `None` and `Some` limits with neither set are different keys: a role
/// with `resources = {}` has the second.
type AppliedKey = (Arc<str>, Option<(Option<u64>, Option<u64>)>);

impl SharedStrings {
    fn share(&mut self, s: &mut Arc<str>) {
        match self.strings.get(s) {
            Some(known) => *s = known.clone(),
            None => {
                self.strings.insert(s.clone());
            }
        }
    }

    /// Points `r`'s shared strings at this pool's copies.
    pub fn share_record(&mut self, r: &mut InstanceRecord) {
        self.share(&mut r.cluster);
        self.share(&mut r.role);
        self.share(&mut r.host);
        if let Some(a) = r.applied.as_mut() {
            self.share(&mut Arc::make_mut(a).package_version);
            let limits = a.limits.map(|l| (l.memory_bytes, l.cpu.map(f64::to_bits)));
            let key = (a.package_version.clone(), limits);
            *a = self.applied.entry(key).or_insert_with(|| a.clone()).clone();
        }
        if !r.ports.is_empty() {
            r.ports = r.ports.with_names(|name| self.share(name));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::records::Limits;
    use crate::storage::{codec, testdata};

    /// Records decoded one by one (a boot) hold a copy of every string
    /// each; shared, they point at one copy, and still read and encode the
    /// same.
    #[test]
    fn records_decoded_apart_share_their_strings_again() {
        let cluster = testdata::cluster("zk");
        let decode = |ordinal| {
            let mut r = testdata::instance(&cluster, ordinal);
            r.applied = Some(Arc::new(Applied { package_version: "3.9.2".into(), limits: None }));
            codec::decode::<InstanceRecord>(&codec::encode(&r).unwrap()).unwrap()
        };
        let (mut a, mut b) = (decode(1), decode(2));
        assert!(!Arc::ptr_eq(&a.cluster, &b.cluster), "decoded apart, they start as copies");
        let (a0, b0) = (a.clone(), b.clone());
        let mut pool = SharedStrings::default();
        pool.share_record(&mut a);
        pool.share_record(&mut b);
        assert!(Arc::ptr_eq(&a.cluster, &b.cluster));
        assert!(Arc::ptr_eq(&a.role, &b.role));
        assert!(Arc::ptr_eq(&a.host, &b.host));
        assert!(Arc::ptr_eq(a.applied.as_ref().unwrap(), b.applied.as_ref().unwrap()));
        // Other limits are another `Applied`, never merged with the first;
        // so are limits with nothing set (a role with `resources = {}`).
        let limits =
            [Some(Limits { memory_bytes: None, cpu: Some(0.5) }), Some(Limits { memory_bytes: None, cpu: None })];
        for (k, limits) in limits.into_iter().enumerate() {
            let mut c = decode(3 + k as u32);
            let limited = Applied { package_version: "3.9.2".into(), limits };
            c.applied = Some(Arc::new(limited.clone()));
            pool.share_record(&mut c);
            assert_eq!(c.applied.as_deref(), Some(&limited));
            let version = |r: &InstanceRecord| r.applied.as_ref().unwrap().package_version.clone();
            assert!(Arc::ptr_eq(&version(&c), &version(&a)));
        }
        assert!(std::ptr::eq(a.ports.iter().next().unwrap().0, b.ports.iter().next().unwrap().0));
        assert_eq!((a.clone(), b.clone()), (a0, b0), "sharing changes no value");
        assert_eq!(codec::encode(&a).unwrap(), codec::encode(&decode(1)).unwrap());
    }
}
