//! The files pages load, embedded in the binary: the console's stylesheet and htmx (npm
//! `htmx.org`, see `assets/vendor/README.md`). Served with a long cache lifetime: their names
//! carry the console's version.

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// (name, media type, bytes).
const FILES: &[(&str, &str, &[u8])] = &[
    ("console.css", "text/css; charset=utf-8", include_bytes!("../assets/console.css")),
    ("htmx.min.js", "text/javascript; charset=utf-8", include_bytes!("../assets/vendor/htmx.min.js")),
];

pub async fn serve(Path(file): Path<String>) -> Response {
    match FILES.iter().find(|(name, _, _)| *name == file) {
        Some((_, media_type, bytes)) => {
            let mut response = bytes.into_response();
            let headers = response.headers_mut();
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(media_type));
            headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("public, max-age=3600"));
            response
        }
        None => (StatusCode::NOT_FOUND, "no such file").into_response(),
    }
}
