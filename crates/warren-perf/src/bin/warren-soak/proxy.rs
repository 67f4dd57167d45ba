//! A TCP relay between one soak worker and the broker, which can cut the worker's connections
//! at any moment: the broker then sees its socket close with no connection.close, as when a
//! client crashes or the network fails. (Dropping an amqprs `Connection` would send
//! connection.close, which is not a disconnect.)

use std::net::SocketAddr;
use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A listening relay to the broker.
pub struct Proxy {
    /// The port clients connect to (on 127.0.0.1).
    pub port: u16,
    cut: watch::Sender<u64>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Listens on an ephemeral loopback port and relays every accepted connection to `broker`.
    pub async fn start(broker: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (cut, rx) = watch::channel(0u64);
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let mut rx = rx.clone();
                rx.borrow_and_update();
                tokio::spawn(async move {
                    let Ok(mut upstream) = TcpStream::connect(broker).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = upstream.set_nodelay(true);
                    tokio::select! {
                        _ = copy_bidirectional(&mut client, &mut upstream) => {}
                        _ = rx.changed() => {
                            // Reset rather than close: no FIN handshake, no data flushed.
                            let _ = client.set_zero_linger();
                            let _ = upstream.set_zero_linger();
                        }
                    }
                });
            }
        });
        Ok(Proxy { port, cut, task })
    }

    /// Cuts every connection currently relayed (new ones are relayed as usual).
    pub fn cut(&self) {
        self.cut.send_modify(|n| *n += 1);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}
