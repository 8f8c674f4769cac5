//! One CA for an installation of several masters (a store on etcd): the
//! store holds it (`meta`/`agent_link_ca`, certificate and key as PEM) and
//! every master copies it into its `ca/` directory before its trust loads,
//! so an agent enrolled by one master is known to all of them. The first
//! leader puts it there: the CA of its `ca/` directory (a single master
//! moved to etcd keeps its agents), or one made with `--init`.

use std::path::Path;
use std::sync::Arc;

use super::TrustError;
use crate::protocol::tls::ca::Ca;
use crate::storage::keys::{SHARED_CA_KEY, master_cf};
use crate::storage::trust_records::CaRecord;
use crate::storage::{MetaStore, StorageError, WriteOp, db};

/// Copies the installation's CA from the store into `ca_dir`; `false`
/// when the store holds none yet (blocking; writes nothing to the store:
/// a follower uses it too).
pub fn copy_from_store(store: &dyn MetaStore, ca_dir: &Path) -> Result<bool, TrustError> {
    let Some(raw) = store.get(master_cf::META, SHARED_CA_KEY)? else { return Ok(false) };
    let rec: CaRecord = db::decode_value(master_cf::META, SHARED_CA_KEY, &raw)?;
    let local = if Ca::exists(ca_dir) { Ca::read_pem(ca_dir).ok() } else { None };
    if local.as_ref() != Some(&(rec.cert_pem.clone(), rec.key_pem.clone())) {
        Ca::replace_with_pem(ca_dir, &rec.cert_pem, &rec.key_pem)?;
        tracing::info!(dir = %ca_dir.display(), "copied the installation's CA from the store");
    }
    Ok(true)
}

/// Makes `ca_dir` hold the installation's CA (see the module doc).
pub async fn sync(store: &Arc<dyn MetaStore>, ca_dir: &Path, create: bool) -> Result<(), TrustError> {
    let (reader, dir) = (store.clone(), ca_dir.to_path_buf());
    let copied = tokio::task::spawn_blocking(move || copy_from_store(&*reader, &dir))
        .await
        .map_err(|e| StorageError::Codec(format!("reading the shared CA: {e}")))??;
    match copied {
        true => {}
        false => {
            if !Ca::exists(ca_dir) {
                if !create {
                    return Err(TrustError::NoCa { dir: ca_dir.display().to_string() });
                }
                let ca = Ca::create(ca_dir)?;
                tracing::info!(fingerprint = %hex::encode(ca.fingerprint()), "created the installation's CA");
            }
            let (cert_pem, key_pem) = Ca::read_pem(ca_dir)?;
            store.commit(vec![WriteOp::put_shared_ca(&CaRecord { version: 1, cert_pem, key_pem })?]).await?;
            tracing::info!("the installation's CA is in the store, shared by every master");
        }
    }
    Ok(())
}
