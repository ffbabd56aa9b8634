//! The certificates of `rediss://` connections, checked before connecting:
//! the PEM parses, the key is the certificate's and not encrypted.

use std::fmt;

use crate::error::LockError;

/// `certificates` if any is set, checked: the PEM holds certificates that
/// parse, the key matches the client certificate, and the backend is a
/// server's, not the `embedded` one (which has no TLS).
pub(crate) fn checked_certificates(
    certificates: Option<Box<redis::TlsCertificates>>,
    embedded: bool,
) -> Result<Option<redis::TlsCertificates>, LockError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let Some(certificates) = certificates else {
        return Ok(None);
    };
    let redis::TlsCertificates {
        client_tls,
        root_cert,
    } = &*certificates;
    if embedded {
        return Err(LockError::Config(
            "TLS certificates are set, but the backend is the embedded one".into(),
        ));
    }
    let invalid = |what: &str, e: &dyn fmt::Display| {
        LockError::Config(format!("invalid TLS certificates: {what}: {e}"))
    };
    let chain = |what: &str, pem: &[u8]| {
        let certs = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid(what, &e))?;
        match certs.is_empty() {
            true => Err(invalid(what, &"no PEM `CERTIFICATE` block")),
            false => Ok(certs),
        }
    };
    if let Some(pem) = root_cert {
        chain("the root certificates", pem)?;
    }
    if let Some(client) = client_tls {
        let certs = chain("the client certificate", &client.client_cert)?;
        if client.client_key.windows(9).any(|w| w == b"ENCRYPTED") {
            return Err(invalid(
                "the client key",
                &"it is encrypted: give it decrypted (`openssl pkey -in key.pem -out plain.pem`)",
            ));
        }
        let key = PrivateKeyDer::from_pem_slice(&client.client_key)
            .map_err(|e| invalid("the client key", &e))?;
        // rustls checks that the key is the certificate's.
        install_crypto_provider();
        rustls::ClientConfig::builder()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_client_auth_cert(certs, key)
            .map_err(|e| match e {
                // rustls parses the certificate only here: an X.509 v1 one
                // (`openssl x509 -req` without `-extfile`) is refused.
                rustls::Error::InvalidCertificate(_) => invalid(
                    "the client certificate",
                    &format!(
                        "{e} (rustls takes X.509 v3 certificates only: sign it with \
                         extensions, as `openssl x509 -req -extfile ...` does)"
                    ),
                ),
                e => invalid("the client key", &e),
            })?;
    }
    Ok(Some(*certificates))
}

/// Installs ring as rustls' process-wide crypto provider, which rustls
/// needs before any TLS configuration is built; a provider the
/// application installed first is kept. rustls 0.23.48 deprecates ring's
/// provider (it has no post-quantum key exchange); it stays, as the one
/// sqlx's `tls-rustls-ring` uses for `fence::postgres` too, and an
/// application that wants post-quantum exchanges installs aws-lc-rs's
/// provider before it builds the client.
#[allow(deprecated)] // from rustls 0.23.48 on; the lockfile has 0.23.46
pub(crate) fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
