//! What Redis says about itself (`INFO`, `DBSIZE`), read by the cost curves
//! and the FCALL comparison.

use redis::aio::MultiplexedConnection;

/// The text of `INFO <section>`.
pub(crate) async fn info(
    conn: &mut MultiplexedConnection,
    section: &str,
) -> Result<String, String> {
    redis::cmd("INFO")
        .arg(section)
        .query_async(conn)
        .await
        .map_err(|e| format!("INFO {section}: {e}"))
}

/// The number after `name:` in an `INFO` text.
pub(crate) fn field(info: &str, name: &str) -> Option<f64> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
}

/// `used_memory`, in bytes.
pub(crate) async fn used_memory(conn: &mut MultiplexedConnection) -> Result<f64, String> {
    let text = info(conn, "memory").await?;
    field(&text, "used_memory").ok_or_else(|| "INFO memory has no used_memory".into())
}

/// CPU seconds the server used so far (`used_cpu_user + used_cpu_sys`).
pub(crate) async fn cpu_seconds(conn: &mut MultiplexedConnection) -> Result<f64, String> {
    let text = info(conn, "cpu").await?;
    match (field(&text, "used_cpu_user"), field(&text, "used_cpu_sys")) {
        (Some(user), Some(sys)) => Ok(user + sys),
        _ => Err("INFO cpu has no used_cpu_user / used_cpu_sys".into()),
    }
}

/// Calls and microseconds of one command in an `INFO commandstats` text
/// (`cmdstat_evalsha:calls=12,usec=345,usec_per_call=28.75,...`); zeros
/// when the command never ran.
pub(crate) fn command(info: &str, name: &str) -> (f64, f64) {
    let prefix = format!("cmdstat_{name}:");
    let Some(stats) = info.lines().find_map(|l| l.strip_prefix(prefix.as_str())) else {
        return (0.0, 0.0);
    };
    let value = |key: &str| {
        stats
            .split(',')
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    (value("calls"), value("usec"))
}

/// Calls of the script commands so far (`EVALSHA`, `EVAL`, `FCALL`): what
/// clients sent, not the commands the scripts ran inside.
pub(crate) async fn script_calls(conn: &mut MultiplexedConnection) -> Result<f64, String> {
    let text = info(conn, "commandstats").await?;
    Ok(["evalsha", "eval", "fcall"]
        .iter()
        .map(|name| command(&text, name).0)
        .sum())
}

/// Microseconds the script commands spent running so far (`usec` of
/// `EVALSHA`, `EVAL`, `FCALL`): the scripts' own time, without reading the
/// request and writing the reply.
pub(crate) async fn script_usec(conn: &mut MultiplexedConnection) -> Result<f64, String> {
    let text = info(conn, "commandstats").await?;
    Ok(["evalsha", "eval", "fcall"]
        .iter()
        .map(|name| command(&text, name).1)
        .sum())
}

/// `DBSIZE`.
pub(crate) async fn dbsize(conn: &mut MultiplexedConnection) -> Result<f64, String> {
    let n: u64 = redis::cmd("DBSIZE")
        .query_async(conn)
        .await
        .map_err(|e| format!("DBSIZE: {e}"))?;
    Ok(n as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_stats_are_read_by_name_and_missing_ones_are_zero() {
        let text = "# Commandstats\r\ncmdstat_evalsha:calls=12,usec=345,usec_per_call=28.75,\
                    rejected_calls=0,failed_calls=0\r\ncmdstat_eval:calls=3,usec=9,usec_per_call=3.00\r\n";
        assert_eq!(command(text, "evalsha"), (12.0, 345.0));
        assert_eq!(command(text, "eval"), (3.0, 9.0));
        assert_eq!(command(text, "fcall"), (0.0, 0.0));
        assert_eq!(
            field(
                "used_memory:1024\r\nused_memory_human:1K\r\n",
                "used_memory"
            ),
            Some(1024.0)
        );
    }
}
