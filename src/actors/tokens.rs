//! API tokens: created, listed and revoked through the API (and the first
//! one by `flotilla master --init`), checked on every `/api/v1` request.
//!
//! A token reads `flt_<id>_<secret>`: the id is public (lists, revocation),
//! the secret is 32 random bytes shown once. The store keeps the secret's
//! SHA-256; requests are checked against an in-memory copy of the table
//! (an `ArcSwap`: no lock on the request path) with a constant-time
//! comparison. The table changes only after the store acknowledged the
//! write, so a token works once its creation is durable and stops working
//! as soon as its revocation is answered.
//!
//! Each token has a [`Scope`]; which route needs which is the HTTP layer's
//! business (`http/auth.rs`). One rule is kept here, where tokens are made,
//! whatever the routes say: a token never mints one of a higher scope than
//! its own ([`ApiTokens::create`] takes the minter's scope).

use std::collections::BTreeMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use time::OffsetDateTime;

use crate::error::Error;
use crate::ids::validate_name;
use crate::scope::Scope;
use crate::storage::keys::master_cf;
use crate::storage::meta::{self, MetaStore};
use crate::storage::records::{RECORD_VERSION, TokenRecord};
use crate::storage::{StorageError, WriteOp};

/// Every token starts with this, so a leaked one is easy to recognise (and
/// to scan for).
pub const TOKEN_PREFIX: &str = "flt_";
/// Random bytes in a token's id (hex in the token).
const ID_BYTES: usize = 6;
/// Random bytes in a token's secret (hex in the token).
const SECRET_BYTES: usize = 32;
/// At most this many tokens.
pub const MAX_TOKENS: usize = 1000;

/// A token just created: its record and the secret, shown this once.
pub struct NewToken {
    pub record: TokenRecord,
    /// The whole token (`flt_<id>_<secret>`), for the `Authorization` header.
    pub token: String,
}

/// Never prints the secret (a `{:?}` in a log line must not leak it).
impl std::fmt::Debug for NewToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewToken").field("id", &self.record.id).field("name", &self.record.name).finish()
    }
}

pub struct ApiTokens {
    store: Arc<dyn MetaStore>,
    table: ArcSwap<BTreeMap<String, Arc<TokenRecord>>>,
    /// Creates and revokes one at a time (each reads the table, writes the
    /// store, then swaps the table).
    writes: Arc<tokio::sync::Mutex<()>>,
}

impl ApiTokens {
    /// Reads every token from the store (blocking: boot only).
    pub fn load(store: Arc<dyn MetaStore>) -> Result<Arc<ApiTokens>, StorageError> {
        let records: Vec<TokenRecord> = meta::load(store.as_ref(), master_cf::TOKENS)?;
        let table = records.into_iter().map(|r| (r.id.clone(), Arc::new(r))).collect();
        Ok(Arc::new(ApiTokens { store, table: ArcSwap::from_pointee(table), writes: Arc::default() }))
    }

    /// The token this `Authorization` value presents, if it is one of ours.
    pub fn verify(&self, presented: &str) -> Option<Arc<TokenRecord>> {
        let (id, secret) = split(presented)?;
        let record = self.table.load().get(id).cloned()?;
        let digest: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
        bool::from(digest.ct_eq(&record.secret_sha256)).then_some(record)
    }

    /// A follower's copy, as the watch sees the leader change it: `Some`
    /// puts the token, `None` forgets token `id` (revoked).
    pub fn mirror(&self, id: &str, record: Option<TokenRecord>) {
        self.table.rcu(|t| {
            let mut next = BTreeMap::clone(t);
            match &record {
                Some(r) => next.insert(id.to_string(), Arc::new(r.clone())),
                None => next.remove(id),
            };
            next
        });
    }

    /// Every token, by id.
    pub fn list(&self) -> Vec<Arc<TokenRecord>> {
        self.table.load().values().cloned().collect()
    }

    /// Whether token `id` exists (is not revoked).
    pub fn contains(&self, id: &str) -> bool {
        self.table.load().contains_key(id)
    }

    pub fn is_empty(&self) -> bool {
        self.table.load().is_empty()
    }

    /// What [`create`](Self::create) would refuse, without creating (a dry run).
    pub fn check_create(&self, name: &str, scope: Scope, by: Scope) -> Result<(), Error> {
        check_mint(name, scope, by)?;
        if self.table.load().len() >= MAX_TOKENS {
            return Err(Error::conflict("too_many_tokens", format!("at most {MAX_TOKENS} tokens; revoke one first")));
        }
        Ok(())
    }

    /// What [`revoke`](Self::revoke) would refuse, without revoking (a dry run).
    pub fn check_revoke(&self, id: &str) -> Result<Arc<TokenRecord>, Error> {
        let table = self.table.load();
        refuse_revoke(&table, id).cloned()
    }

    /// Creates a token named `name` of `scope`, asked for by a token of
    /// scope `by` (which may mint its own scope or a lower one); answers
    /// once it is durable.
    pub async fn create(self: &Arc<Self>, name: &str, scope: Scope, by: Scope) -> Result<NewToken, Error> {
        check_mint(name, scope, by)?;
        self.create_then(name, scope, |_| Ok(())).await
    }

    /// Like [`create`](Self::create), calling `hand_over` with the token
    /// before it is stored: a token that cannot be handed over (its file
    /// cannot be written) is never stored, so it cannot lock anyone out.
    /// Asked for by the master's own operator (`--init`), not a token.
    pub async fn create_then(
        self: &Arc<Self>,
        name: &str,
        scope: Scope,
        hand_over: impl FnOnce(&NewToken) -> Result<(), Error>,
    ) -> Result<NewToken, Error> {
        validate_name(name).map_err(|m| Error::invalid("invalid_name", format!("token name: {m}")))?;
        let one = self.writes.clone().lock_owned().await;
        let table = self.table.load_full();
        if table.len() >= MAX_TOKENS {
            return Err(Error::conflict("too_many_tokens", format!("at most {MAX_TOKENS} tokens; revoke one first")));
        }
        let (id, secret) = loop {
            let id = hex::encode(random::<ID_BYTES>()?);
            if !table.contains_key(&id) {
                break (id, hex::encode(random::<SECRET_BYTES>()?));
            }
        };
        let record = TokenRecord {
            version: RECORD_VERSION,
            id: id.clone(),
            name: name.to_string(),
            secret_sha256: Sha256::digest(secret.as_bytes()).into(),
            created_at: OffsetDateTime::now_utc(),
            scope,
        };
        let new = NewToken { record, token: format!("{TOKEN_PREFIX}{id}_{secret}") };
        hand_over(&new)?;
        let mut next = (*table).clone();
        next.insert(id, Arc::new(new.record.clone()));
        self.commit_then_swap(one, WriteOp::put_token(&new.record)?, next).await?;
        Ok(new)
    }

    /// Writes `op`, then makes `next` the table, in a task of its own: a
    /// caller that stops waiting (a client that hung up) cannot leave the
    /// store changed and the table not (a revoked token still accepted).
    /// The task holds the write lock until the table is swapped.
    async fn commit_then_swap(
        self: &Arc<Self>,
        one: tokio::sync::OwnedMutexGuard<()>,
        op: WriteOp,
        next: BTreeMap<String, Arc<TokenRecord>>,
    ) -> Result<(), Error> {
        let me = self.clone();
        let task = tokio::spawn(async move {
            let written = me.store.try_commit(vec![op]).await;
            if written.is_ok() {
                me.table.store(Arc::new(next));
            }
            drop(one);
            written
        });
        task.await.map_err(|e| Error::Internal { message: format!("token write task: {e}") })?.map_err(Error::from)
    }

    /// Revokes token `id`: from the answer on, it is refused. The last token
    /// is kept (without one, nobody could use the API to make another).
    pub async fn revoke(self: &Arc<Self>, id: &str) -> Result<TokenRecord, Error> {
        let one = self.writes.clone().lock_owned().await;
        let table = self.table.load_full();
        let record = refuse_revoke(&table, id)?;
        let mut next = (*table).clone();
        next.remove(id);
        self.commit_then_swap(one, WriteOp::delete_token(id), next).await?;
        Ok((**record).clone())
    }
}

/// A token of scope `by` may mint a token named `name` of `scope`: the
/// name is valid and `scope` is not above `by`.
fn check_mint(name: &str, scope: Scope, by: Scope) -> Result<(), Error> {
    validate_name(name).map_err(|m| Error::invalid("invalid_name", format!("token name: {m}")))?;
    if !by.allows(scope) {
        return Err(Error::forbidden(format!("minting a token of scope `{scope}`"), scope, by));
    }
    Ok(())
}

/// `flt_<id>_<secret>` into its id and secret; `None` for anything else.
fn split(token: &str) -> Option<(&str, &str)> {
    let rest = token.strip_prefix(TOKEN_PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    let hex_of = |s: &str, bytes: usize| s.len() == bytes * 2 && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex_of(id, ID_BYTES) && hex_of(secret, SECRET_BYTES)).then_some((id, secret))
}

pub(crate) fn random<const N: usize>() -> Result<[u8; N], Error> {
    let mut buf = [0u8; N];
    getrandom::fill(&mut buf).map_err(|e| Error::Internal { message: format!("no randomness for a token: {e}") })?;
    Ok(buf)
}

/// Token `id`, unless revoking it would leave no admin token: without one,
/// nobody could mint tokens, upload packages or manage nodes through the
/// API again (read and operate tokens cannot make an admin one).
fn refuse_revoke<'a>(table: &'a BTreeMap<String, Arc<TokenRecord>>, id: &str) -> Result<&'a Arc<TokenRecord>, Error> {
    let record = table.get(id).ok_or_else(|| Error::not_found("token", id))?;
    let admins = table.values().filter(|r| r.scope == Scope::Admin).count();
    if record.scope == Scope::Admin && admins == 1 {
        return Err(Error::conflict(
            "last_token",
            format!("token {id} is the last admin token; create another admin token before revoking it"),
        ));
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::MasterStore;

    fn tokens(dir: &std::path::Path) -> Arc<ApiTokens> {
        let store: Arc<dyn MetaStore> = Arc::new(MasterStore::open(dir).unwrap());
        ApiTokens::load(store).unwrap()
    }

    #[tokio::test]
    async fn a_created_token_verifies_survives_a_reopen_and_stops_when_revoked() {
        let dir = tempfile::tempdir().unwrap();
        let t = tokens(dir.path());
        assert!(t.is_empty());
        let a = t.create("alice", Scope::Admin, Scope::Admin).await.unwrap();
        let b = t.create("ci", Scope::Admin, Scope::Admin).await.unwrap();
        assert!(a.token.starts_with("flt_"));
        assert_eq!(t.verify(&a.token).unwrap().name, "alice");
        assert_eq!(t.verify(&b.token).unwrap().id, b.record.id);

        // A secret one character off, another token's secret under this
        // id, a truncated token, junk: all refused.
        let mut wrong = a.token.clone();
        let last = wrong.pop().unwrap();
        wrong.push(if last == '0' { '1' } else { '0' });
        assert!(t.verify(&wrong).is_none());
        let b_secret = b.token.rsplit('_').next().unwrap();
        assert!(t.verify(&format!("flt_{}_{b_secret}", a.record.id)).is_none());
        assert!(t.verify(&a.token[..a.token.len() - 2]).is_none());
        assert!(t.verify("").is_none());
        assert!(t.verify("Bearer x").is_none());

        drop(t);
        let t = tokens(dir.path());
        assert_eq!(t.list().len(), 2);
        assert!(t.verify(&a.token).is_some(), "a token survives a restart");
        t.revoke(&a.record.id).await.unwrap();
        assert!(t.verify(&a.token).is_none(), "revoked: refused at once");
        assert!(t.verify(&b.token).is_some());
        drop(t);
        let t = tokens(dir.path());
        assert!(t.verify(&a.token).is_none(), "the revocation is durable");
    }

    #[tokio::test]
    async fn the_last_token_is_kept_and_names_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let t = tokens(dir.path());
        let only = t.create("initial", Scope::Admin, Scope::Admin).await.unwrap();
        let err = t.revoke(&only.record.id).await.unwrap_err();
        assert!(matches!(err, Error::Conflict { code: "last_token", .. }), "{err}");
        assert!(t.verify(&only.token).is_some());
        assert!(matches!(t.revoke("nope").await.unwrap_err(), Error::NotFound { .. }));
        assert!(matches!(
            t.create("Bad Name", Scope::Admin, Scope::Admin).await.unwrap_err(),
            Error::Invalid { code: "invalid_name", .. }
        ));
        assert_eq!(t.list().len(), 1);
        // With a read token beside it, the admin one is still the last admin.
        let read = t.create("dash", Scope::Read, Scope::Admin).await.unwrap();
        let err = t.revoke(&only.record.id).await.unwrap_err();
        assert!(matches!(err, Error::Conflict { code: "last_token", .. }), "{err}");
        assert!(t.check_revoke(&only.record.id).is_err());
        t.revoke(&read.record.id).await.unwrap();
        let second = t.create("second", Scope::Admin, Scope::Admin).await.unwrap();
        t.revoke(&only.record.id).await.unwrap();
        assert!(t.verify(&second.token).is_some());
    }

    #[tokio::test]
    async fn a_token_that_cannot_be_handed_over_is_not_stored() {
        let dir = tempfile::tempdir().unwrap();
        let t = tokens(dir.path());
        let err = t
            .create_then("initial", Scope::Admin, |_| Err(Error::invalid("token_file", "read-only")))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Invalid { code: "token_file", .. }), "{err}");
        assert!(t.is_empty());
        drop(t);
        assert!(tokens(dir.path()).is_empty(), "nothing reached the store either");
    }

    /// A token mints its own scope or a lower one, never a higher one,
    /// whatever the routes allow; a dry run says the same.
    #[tokio::test]
    async fn a_token_never_mints_above_its_own_scope() {
        let dir = tempfile::tempdir().unwrap();
        let t = tokens(dir.path());
        for by in Scope::ALL {
            for scope in Scope::ALL {
                let name = format!("{by}-makes-{scope}");
                let made = t.create(&name, scope, by).await;
                let checked = t.check_create(&name, scope, by);
                if scope <= by {
                    let made = made.unwrap();
                    assert_eq!(t.verify(&made.token).unwrap().scope, scope, "{name}");
                    checked.unwrap();
                } else {
                    for err in [made.unwrap_err(), checked.unwrap_err()] {
                        assert_eq!(err, Error::forbidden(format!("minting a token of scope `{scope}`"), scope, by));
                        assert_eq!(
                            err.to_string(),
                            format!(
                                "minting a token of scope `{scope}` needs the `{scope}` scope; this token has `{by}`"
                            )
                        );
                    }
                }
            }
        }
        // read: read; operate: read, operate; admin: all three.
        assert_eq!(t.list().len(), 6);
        drop(t);
        let t = tokens(dir.path());
        let mut stored: Vec<(String, Scope)> = t.list().iter().map(|r| (r.name.clone(), r.scope)).collect();
        stored.sort();
        assert_eq!(
            stored.iter().filter(|(n, s)| n.ends_with(s.as_str())).count(),
            6,
            "scopes survive a reopen: {stored:?}"
        );
    }
}
