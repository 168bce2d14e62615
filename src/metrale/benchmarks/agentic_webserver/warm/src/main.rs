//! The warm project's server: the shape a ping/pong task produces, so `cargo build` and
//! `cargo test` here compile every dependency the agent's project will ask for.
use axum::{routing::get, Router};

fn app() -> Router {
    Router::new().route("/ping", get(|| async { "pong" }))
}

#[tokio::main]
async fn main() {
    let port: u16 = std::env::var("METRALE_HARNESS_PORT")
        .unwrap_or_else(|_| "3001".to_string())
        .parse()
        .unwrap();
    let listener = tokio::net::TcpListener::bind(("0.0.0.0", port)).await.unwrap();
    axum::serve(listener, app()).await.unwrap();
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    #[tokio::test]
    async fn ping_answers_pong() {
        let response = app()
            .oneshot(Request::builder().uri("/ping").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"pong");
    }
}
