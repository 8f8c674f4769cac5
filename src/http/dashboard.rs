//! The dashboard: a page and its scripts, compiled into the binary from
//! `assets/dashboard/` (no toolchain, no network), served at `/` and
//! `/ui/{file}` without a token. The page holds no data: it asks the API
//! with the token the operator gives it (from the `#token=` fragment, which
//! never reaches the server, into `sessionStorage`), and goes live through
//! `GET /api/v1/events`. Nothing of it runs on the master while no one has
//! it open.

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use sha2::{Digest, Sha256};
use std::sync::OnceLock;

use super::error::ApiError;
use crate::error::Error;

/// (name, content type, bytes) of every asset.
const ASSETS: &[(&str, &str, &[u8])] = &[
    ("index.html", "text/html; charset=utf-8", include_bytes!("../../assets/dashboard/index.html")),
    ("style.css", "text/css; charset=utf-8", include_bytes!("../../assets/dashboard/style.css")),
    ("app.js", "text/javascript; charset=utf-8", include_bytes!("../../assets/dashboard/app.js")),
    ("api.js", "text/javascript; charset=utf-8", include_bytes!("../../assets/dashboard/api.js")),
    ("live.js", "text/javascript; charset=utf-8", include_bytes!("../../assets/dashboard/live.js")),
    ("ui.js", "text/javascript; charset=utf-8", include_bytes!("../../assets/dashboard/ui.js")),
    ("masters.js", "text/javascript; charset=utf-8", include_bytes!("../../assets/dashboard/masters.js")),
    ("actions.js", "text/javascript; charset=utf-8", include_bytes!("../../assets/dashboard/actions.js")),
    ("actors.js", "text/javascript; charset=utf-8", include_bytes!("../../assets/dashboard/actors.js")),
    ("clusters.js", "text/javascript; charset=utf-8", include_bytes!("../../assets/dashboard/clusters.js")),
    ("operations.js", "text/javascript; charset=utf-8", include_bytes!("../../assets/dashboard/operations.js")),
    ("nodes.js", "text/javascript; charset=utf-8", include_bytes!("../../assets/dashboard/nodes.js")),
    ("events.js", "text/javascript; charset=utf-8", include_bytes!("../../assets/dashboard/events.js")),
];

/// Scripts, styles and connections only from this origin; no inline code,
/// no framing, no referrer (a URL never carries the token anyway).
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Each asset's ETag (a hash of its bytes), computed once.
fn etags() -> &'static [String] {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    TAGS.get_or_init(|| {
        ASSETS.iter().map(|(_, _, body)| format!("\"{}\"", hex::encode(&Sha256::digest(body)[..8]))).collect()
    })
}

fn serve(req: &HttpRequest, name: &str) -> Result<HttpResponse, ApiError> {
    let i = ASSETS
        .iter()
        .position(|(n, _, _)| *n == name)
        .ok_or_else(|| Error::not_found("asset", format!("{name}: the dashboard has no such file")))?;
    let (_, ctype, body) = ASSETS[i];
    let etag = &etags()[i];
    let fresh = req.headers().get(header::IF_NONE_MATCH).is_some_and(|v| v.as_bytes() == etag.as_bytes());
    let mut rsp = if fresh { HttpResponse::NotModified() } else { HttpResponse::Ok() };
    rsp.insert_header((header::ETAG, etag.as_str()))
        // Always revalidated, so a new binary's page is seen at once.
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header((header::CONTENT_SECURITY_POLICY, CSP))
        .insert_header((header::REFERRER_POLICY, "no-referrer"))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::X_FRAME_OPTIONS, "DENY"));
    Ok(if fresh { rsp.finish() } else { rsp.content_type(ctype).body(body) })
}

/// `GET /`: the page.
pub async fn index(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    serve(&req, "index.html")
}

/// `GET /ui/{file}`: its scripts and styles.
pub async fn asset(req: HttpRequest, path: web::Path<String>) -> Result<HttpResponse, ApiError> {
    serve(&req, &path.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_the_page_loads_is_served_and_every_served_file_is_used() {
        let page = std::str::from_utf8(ASSETS[0].2).unwrap();
        let all: String = ASSETS.iter().map(|(_, _, b)| String::from_utf8_lossy(b).to_string()).collect();
        for (name, _, _) in &ASSETS[1..] {
            assert!(
                all.contains(&format!("/ui/{name}")) || all.contains(&format!("./{name}")),
                "{name} is never loaded"
            );
        }
        assert!(page.contains("/ui/app.js") && page.contains("/ui/style.css"));
        // No inline script or style: the CSP would refuse it. Every
        // <script> has a src and is empty; no <style> block, no style="".
        for tag in page.split("<script").skip(1) {
            let open = &tag[..tag.find('>').expect("a closed <script> tag")];
            assert!(open.contains("src="), "an inline script: <script{open}>");
            assert!(tag[open.len() + 1..].trim_start().starts_with("</script>"), "a script with a body");
        }
        assert!(!page.contains("<style") && !page.contains("style=\""), "inline style in index.html");
    }
}
