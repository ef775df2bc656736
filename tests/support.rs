//! Helpers shared by the test modules.

use loadout_server::app::{App, Config};
use loadout_server::http::{HttpState, app};

/// An HTTP app on a fresh data dir; keep the `TempDir` alive for the test.
pub async fn http_app(token: Option<&str>) -> (tempfile::TempDir, axum::Router) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = Config {
        data_dir: dir.path().to_path_buf(),
        database_url: None,
    };
    let app_state = App::open(&config).await.expect("open app");
    let state = HttpState::new(app_state, token.map(Into::into));
    (dir, app(state))
}
