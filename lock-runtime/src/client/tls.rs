//! The `tls` feature's part of [`LockClientBuilder`]: a private CA and a
//! client certificate for `rediss://` servers (checked by `build`, in
//! `backend/certificates.rs`).

use super::builder::LockClientBuilder;

impl LockClientBuilder {
    /// Trusts the CA certificates in `pem` (one or more PEM `CERTIFICATE`
    /// blocks) for every `rediss://` server, and no others: a private CA,
    /// without changing the process's environment. Without it, the roots
    /// are the system's, or those of `SSL_CERT_FILE` / `SSL_CERT_DIR` when
    /// set (which then replace the system's). Feature `tls`. `build` fails with
    /// [`LockError::Config`](crate::LockError::Config) for PEM that holds no certificate or does not
    /// parse, and for a `redis://` URL: certificates are for TLS only.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = lock_runtime::LockClient::builder()
    ///     .redis("rediss://locks.internal:6380")
    ///     .tls_root_certificates(std::fs::read("/etc/locks/ca.pem")?)
    ///     .tls_client_certificate(
    ///         std::fs::read("/etc/locks/client.pem")?,
    ///         std::fs::read("/etc/locks/client.key")?,
    ///     )
    ///     .build()
    ///     .await?;
    /// # drop(client); Ok(()) }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_root_certificates(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.certificates().root_cert = Some(pem.into());
        self
    }

    /// Presents a client certificate to every `rediss://` server: mutual
    /// TLS, which Redis and Valkey ask for unless told otherwise
    /// (`tls-auth-clients yes`, their default). `cert_pem`: the client's
    /// certificate, then any intermediates; `key_pem`: its private key
    /// (PKCS#8, PKCS#1 or SEC1 PEM, not encrypted: decrypt one with
    /// `openssl pkey -in key.pem -out plain.pem`). Feature `tls`; an example
    /// at [`tls_root_certificates`](Self::tls_root_certificates). `build`
    /// fails with [`LockError::Config`](crate::LockError::Config) for PEM that does not parse, an
    /// encrypted key, or a key that does not match the certificate.
    ///
    /// Applies to every server the client reaches over TLS: one server,
    /// Redlock's masters, a cluster's nodes, and with `.sentinel(..)` both
    /// the sentinels and the master (over TLS when the sentinels' URLs are
    /// `rediss://`).
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_client_certificate(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.certificates().client_tls = Some(redis::ClientTlsConfig {
            client_cert: cert_pem.into(),
            client_key: key_pem.into(),
        });
        self
    }

    fn certificates(&mut self) -> &mut redis::TlsCertificates {
        self.certificates.get_or_insert_with(|| {
            Box::new(redis::TlsCertificates {
                client_tls: None,
                root_cert: None,
            })
        })
    }
}
