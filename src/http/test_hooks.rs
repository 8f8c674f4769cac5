//! Test-only fault injection (`test_hooks` in the master's config, off by
//! default; an admin token): `POST /test-hooks/actors/{kind}/{id}/panic`
//! makes the actor or task panic where it runs (a cluster actor in a
//! handler, an instance actor in its next turn, a node manager at its
//! agent's next frame, a link writer at its next frame, an event write
//! (`announce/announce`), a supervised task inside its incarnation, the
//! supervisor in its handler: the master exits), `.../stall?ms=N` holds a cluster actor or the supervisor
//! for N ms without taking a message (its thread stays free), and
//! `.../block?ms=N` blocks the thread of a cluster actor or of the
//! supervisor for N ms (everything else on that thread waits). The
//! supervision tests use them to fail each kind of child for real.

use std::time::Duration;

use actix_web::{HttpResponse, web};
use serde::Deserialize;

use super::AppState;
use super::ask::ask;
use super::error::ApiError;
use crate::actors::supervisor::{ActorVerb, ActorVerbAnswer, Fault, Verb};
use crate::error::Error;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stall {
    #[serde(default)]
    ms: u64,
}

pub async fn inject(
    state: web::Data<AppState>,
    path: web::Path<(String, String, String)>,
    q: web::Query<Stall>,
) -> Result<HttpResponse, ApiError> {
    let (kind, id, fault) = path.into_inner();
    let fault = match fault.as_str() {
        "panic" => Fault::Panic,
        "stall" => Fault::Stall(Duration::from_millis(q.ms)),
        "block" => Fault::Block(Duration::from_millis(q.ms)),
        other => {
            return Err(ApiError(Error::invalid("bad_fault", format!("no fault {other:?}: panic, stall or block"))));
        }
    };
    let slot = state.reserve_supervisor()?;
    let limit = state.shared.limits.request_take_limit;
    let verb = Verb::Inject(fault);
    let answer: ActorVerbAnswer =
        ask(&state.supervisor, slot, limit, |slot| ActorVerb { kind, id, verb, slot }).await??;
    Ok(HttpResponse::Ok().json(answer))
}

/// `POST /test-hooks/pools/{name}/faults`: the faults pool `name`'s driver
/// shows from now (`providers::faulty::Faults`; `{}` clears them).
pub async fn pool_faults(
    state: web::Data<AppState>,
    name: web::Path<String>,
    body: web::Json<crate::providers::faulty::Faults>,
) -> Result<HttpResponse, ApiError> {
    let name = name.into_inner();
    let pool = state.pools.pool(&name).ok_or_else(|| Error::not_found("pool", &name))?;
    let faulty =
        pool.faulty.as_ref().ok_or_else(|| Error::invalid("bad_fault", "this pool's driver is not wrapped"))?;
    faulty.set(body.into_inner());
    Ok(HttpResponse::NoContent().finish())
}
