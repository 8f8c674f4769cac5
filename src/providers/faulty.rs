//! A driver wrapped with faults a test asks for (`test_hooks` only: the
//! master wraps every pool's driver in one when its test hooks are on, and
//! `POST /test-hooks/pools/{name}/faults` sets them). The launcher's policy
//! (retries, timeouts, quota, leak cleanup) is tested once, through this,
//! around a real driver: a fault never replaces the driver's work, it
//! comes before or after it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use serde::Deserialize;

use super::driver::{Driver, DriverError, DriverQuota, ErrorClass, LaunchSpec, Resource, ResourceState};

/// The faults to inject, as a test sets them (every field optional).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Faults {
    /// The next creates fail with these classes, one each, before the
    /// driver is called.
    pub create_errors: VecDeque<ErrorClass>,
    /// The next creates make their resource, then answer with these
    /// classes, one each (the launcher must find it by its tag and
    /// delete it).
    pub create_errors_after: VecDeque<ErrorClass>,
    /// Each create waits this long before the driver makes anything (a
    /// launch timeout).
    #[serde(with = "millis")]
    pub create_delay_before: Duration,
    /// Each create waits this long after the driver made its resource,
    /// before answering (a master killed here must adopt it).
    #[serde(with = "millis")]
    pub create_delay_after: Duration,
    /// The driver is given a master address where nothing listens (port
    /// 1): the agent starts and dials in vain, never enrolling (an enroll
    /// timeout).
    pub unreachable_master: bool,
    /// The next lists fail (a partial listing).
    pub list_errors: u32,
    /// The next deletes fail, transiently.
    pub delete_errors: u32,
}

mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

impl<'de> Deserialize<'de> for ErrorClass {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match String::deserialize(d)?.as_str() {
            "quota" => Ok(ErrorClass::Quota),
            "capacity" => Ok(ErrorClass::Capacity),
            "config" => Ok(ErrorClass::Config),
            "transient" => Ok(ErrorClass::Transient),
            other => Err(serde::de::Error::custom(format!(
                "{other:?} is not an error class (quota, capacity, config, transient)"
            ))),
        }
    }
}

/// A driver with faults in front of it.
pub struct Faulty {
    inner: Arc<dyn Driver>,
    faults: Mutex<Faults>,
}

impl Faulty {
    pub fn new(inner: Arc<dyn Driver>) -> Faulty {
        Faulty { inner, faults: Mutex::new(Faults::default()) }
    }

    /// Replaces the faults.
    pub fn set(&self, faults: Faults) {
        *self.faults.lock().unwrap_or_else(|p| p.into_inner()) = faults;
    }

    fn with<T>(&self, f: impl FnOnce(&mut Faults) -> T) -> T {
        f(&mut self.faults.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl Driver for Faulty {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn host_log(&self, host: &str, max_bytes: u64) -> Option<Result<String, DriverError>> {
        self.inner.host_log(host, max_bytes)
    }

    fn create<'a>(&'a self, spec: &'a LaunchSpec) -> BoxFuture<'a, Result<String, DriverError>> {
        Box::pin(async move {
            let (error, error_after, before, after, unreachable) = self.with(|f| {
                let error_after = if f.create_errors.is_empty() { f.create_errors_after.pop_front() } else { None };
                (
                    f.create_errors.pop_front(),
                    error_after,
                    f.create_delay_before,
                    f.create_delay_after,
                    f.unreachable_master,
                )
            });
            if let Some(class) = error {
                return Err(DriverError::new(class, format!("injected {class:?} error (test hook)")));
            }
            tokio::time::sleep(before).await;
            let id = if unreachable {
                let mut spoiled = spec.clone();
                spoiled.master_addr.set_port(1);
                self.inner.create(&spoiled).await?
            } else {
                self.inner.create(spec).await?
            };
            tokio::time::sleep(after).await;
            if let Some(class) = error_after {
                return Err(DriverError::new(class, format!("injected {class:?} error after the create (test hook)")));
            }
            Ok(id)
        })
    }

    fn status<'a>(&'a self, external_id: &'a str) -> BoxFuture<'a, Result<ResourceState, DriverError>> {
        self.inner.status(external_id)
    }

    fn delete<'a>(&'a self, external_id: &'a str) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            if self.with(|f| f.delete_errors.checked_sub(1).map(|n| f.delete_errors = n)).is_some() {
                return Err(DriverError::transient("injected delete failure (test hook)"));
            }
            self.inner.delete(external_id).await
        })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<Resource>, DriverError>> {
        Box::pin(async move {
            if self.with(|f| f.list_errors.checked_sub(1).map(|n| f.list_errors = n)).is_some() {
                return Err(DriverError::transient("injected list failure (test hook)"));
            }
            self.inner.list().await
        })
    }

    fn quota(&self) -> BoxFuture<'_, Result<DriverQuota, DriverError>> {
        self.inner.quota()
    }
}
