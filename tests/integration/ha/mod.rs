//! Several masters on etcd (issue 25): the store on real etcd members, the
//! leader's election and fence, and masters that take over.

mod big_failover;
mod blobs;
mod dev_ha;
mod fencing;
mod followers;
mod masters;
mod migrate;
mod rolling;
mod store;
