//! TLS certificates for `redis-server --tls-port`, made with `openssl`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Result;

/// TLS files for `redis-server --tls-port`.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// The self-signed CA certificate clients must trust.
    pub ca: PathBuf,
    /// The server's certificate (for `127.0.0.1`, signed by the CA).
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
}

fn openssl(args: &[&str], dir: &Path) -> Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| format!("openssl: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "openssl {} failed: {}",
            args.first().copied().unwrap_or_default(),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Generates with `openssl`, in `dir`, a self-signed CA (`openssl req -x509`)
/// and a server certificate for `127.0.0.1` signed by it, which `redis-cli`
/// presents as its own where the server asks for one. (rustls refuses a
/// self-signed CA certificate presented as the server's own:
/// `CaUsedAsEndEntity`; so the server gets a leaf.)
pub fn self_signed_cert(dir: &Path) -> Result<TlsFiles> {
    openssl(
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=fault test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
        ],
        dir,
    )?;
    openssl(
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "redis.key",
            "-out",
            "redis.csr",
        ],
        dir,
    )?;
    std::fs::write(
        dir.join("leaf.ext"),
        "basicConstraints=critical,CA:FALSE\nsubjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .map_err(|e| e.to_string())?;
    sign(dir, "redis.csr", "leaf.ext", "redis.crt")?;
    Ok(TlsFiles {
        ca: dir.join("ca.crt"),
        cert: dir.join("redis.crt"),
        key: dir.join("redis.key"),
    })
}

/// A client certificate for mutual TLS (`--tls-auth-clients yes`), signed
/// in `dir` by the CA [`self_signed_cert`] made there: (certificate, key)
/// PEM files, named after `name`.
pub fn client_cert(dir: &Path, name: &str) -> Result<(PathBuf, PathBuf)> {
    let (key, csr, cert) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
    );
    let subject = format!("/CN={name}");
    openssl(
        &[
            "req", "-newkey", "rsa:2048", "-nodes", "-subj", &subject, "-keyout", &key, "-out",
            &csr,
        ],
        dir,
    )?;
    let ext = format!("{name}.ext");
    std::fs::write(
        dir.join(&ext),
        "basicConstraints=critical,CA:FALSE\nextendedKeyUsage=clientAuth\n",
    )
    .map_err(|e| e.to_string())?;
    sign(dir, &csr, &ext, &cert)?;
    Ok((dir.join(cert), dir.join(key)))
}

/// Signs the request `csr` in `dir` with the CA there, with the extensions
/// in `ext`, into `out`.
fn sign(dir: &Path, csr: &str, ext: &str, out: &str) -> Result<()> {
    let args = [
        "x509", "-req", "-in", csr, "-CA", "ca.crt", "-CAkey", "ca.key",
    ];
    let more = [
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        ext,
        "-out",
        out,
    ];
    openssl(&[&args[..], &more[..]].concat(), dir)
}
