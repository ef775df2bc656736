//! The settings listener: its own connection with `LISTEN loadout_settings`, turning
//! notifications into [`SettingsChange`]s that the settings cache subscribes to.

use std::time::Duration;

use tokio::sync::watch;
use tokio_postgres::{AsyncMessage, NoTls};

use super::{SETTINGS_CHANNEL, error_chain};
use crate::SettingsChange;

const LISTENER_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Owns the task that listens for settings notifications; stops it when dropped.
pub(super) struct SettingsListener {
    pub(super) changes: watch::Receiver<SettingsChange>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SettingsListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SettingsListener {
    pub(super) fn spawn(config: tokio_postgres::Config, url_masked: String) -> SettingsListener {
        let (sender, changes) = watch::channel(SettingsChange::default());
        let task = tokio::spawn(listen(config, url_masked, sender));
        SettingsListener { changes, task }
    }
}

/// Keeps a connection with `LISTEN loadout_settings` open, reconnecting with
/// backoff. Every notification, every (re)connect and every loss bumps the
/// generation: caches drop what they hold, since writes may have been missed.
async fn listen(
    config: tokio_postgres::Config,
    url_masked: String,
    sender: watch::Sender<SettingsChange>,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match config.connect(NoTls).await {
            Ok((client, mut connection)) => {
                let (note_tx, mut note_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
                // The connection must be polled for the LISTEN to go through, and
                // afterwards to receive notifications; it ends when the link breaks.
                let driver = tokio::spawn(async move {
                    loop {
                        match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                            Some(Ok(AsyncMessage::Notification(_))) => {
                                if note_tx.send(()).is_err() {
                                    break;
                                }
                            }
                            Some(Ok(_)) => {}
                            Some(Err(e)) => {
                                tracing::debug!("settings listener connection ended: {e}");
                                break;
                            }
                            None => break,
                        }
                    }
                });
                match client
                    .batch_execute(&format!("LISTEN {SETTINGS_CHANNEL}"))
                    .await
                {
                    Ok(()) => {
                        backoff = Duration::from_millis(100);
                        sender.send_modify(|c| {
                            c.generation += 1;
                            c.listening = true;
                        });
                        while note_rx.recv().await.is_some() {
                            sender.send_modify(|c| c.generation += 1);
                        }
                        tracing::warn!(
                            "lost the settings listener connection to {url_masked}; reconnecting"
                        );
                    }
                    Err(e) => {
                        tracing::warn!(
                            "cannot listen for settings changes on {url_masked}: {}",
                            error_chain(&e)
                        );
                    }
                }
                driver.abort();
                sender.send_modify(|c| {
                    c.generation += 1;
                    c.listening = false;
                });
            }
            Err(e) => {
                tracing::debug!(
                    "settings listener cannot connect to {url_masked}: {}",
                    error_chain(&e)
                );
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(LISTENER_BACKOFF_MAX);
    }
}
