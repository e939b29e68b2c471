//! Mutual TLS between the processes of a job: every process presents a certificate signed by
//! the job's CA (generated here with rcgen) and trusts only that CA.

mod common;
mod net_support;

use net_support::{fast_heartbeats, make_tls, Cluster, ClusterSpec, Scratch};
use taskd::actors::control::ControlClient;
use taskd::actors::net::TlsPem;

#[test]
fn a_job_over_mutual_tls_switches_and_refuses_strangers() {
    let scratch = Scratch::new("net-tls");
    let (flags, pem) = make_tls(&scratch, "job");
    let mut common = fast_heartbeats();
    common.extend(flags);
    let mut c = Cluster::start(
        &scratch,
        ClusterSpec {
            job: "net-tls",
            nodes: 2,
            ppn: 2,
            worker_flags: &|_| Vec::new(),
            manager_flags: Vec::new(),
            common,
            tls: Some(pem.clone()),
        },
    );
    let cmd = c.command(&[(1, 0, true)]);
    let r = c.run(&cmd).unwrap();
    assert_eq!(r.result, "succeeded", "{r:#?}");
    let st = c.status(0);
    assert_eq!(st.ranks_on_backup, [2]);

    // A client whose certificate another CA signed is refused by the manager's control port...
    let (_, foreign) = make_tls(&scratch, "foreign");
    let stranger = TlsPem {
        identity: foreign.identity,
        ..pem.clone()
    };
    let refused = c.rt.block_on(async {
        let mut a = ControlClient::connect(&c.control_addr, Some(&stranger)).await?;
        a.status("net-tls", 0).await
    });
    assert!(refused.is_err(), "a foreign certificate was accepted");
    // ... and so is one without TLS at all.
    let plain = c.rt.block_on(async {
        let mut a = ControlClient::connect(&c.control_addr, None).await?;
        a.status("net-tls", 0).await
    });
    assert!(plain.is_err(), "a plaintext client was accepted");
    // The transport port serves the job's own traffic only: no operator service there, even
    // for a client with the job's certificate.
    let transport = c.rt.block_on(async {
        let mut a = ControlClient::connect(&c.manager_addr, Some(&pem)).await?;
        a.status("net-tls", 0).await
    });
    assert!(
        matches!(&transport, Err(taskd::actors::control::ClientError::Rpc(s)) if s.code() == tonic::Code::Unimplemented),
        "the transport port answered an operator call: {transport:?}"
    );

    c.shutdown_cleanly();
}

/// TLS material that cannot work is named with its cause: a key that is not the
/// certificate's is refused at start (exit 2, naming both files and what TLS said), and a
/// client that does not trust the server's CA is told why the handshake failed, not a bare
/// "transport error".
#[test]
fn tls_failures_name_their_cause() {
    let scratch = Scratch::new("net-tls-causes");
    let (flags, pem) = make_tls(&scratch, "job");
    let (other, _) = make_tls(&scratch, "other");
    // The job's CA and certificate with another certificate's key.
    let mismatched = [&flags[..4], &other[4..]].concat();
    let mut args = common::manager_args("tls-causes", "1").to_vec();
    args.extend(mismatched.iter().map(String::as_str));
    let (code, _, err) = common::taskd(&args);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("do not make an identity"), "{err}");
    assert!(err.contains(&other[5]), "names the key: {err}");
    let cause = err
        .split("do not make an identity: ")
        .nth(1)
        .unwrap_or_default();
    assert!(
        cause.trim() != "transport error" && cause.len() > "transport error".len(),
        "a cause under the transport's error: {err}"
    );

    let c = Cluster::start(
        &scratch,
        ClusterSpec {
            job: "tls-causes",
            nodes: 1,
            ppn: 1,
            worker_flags: &|_| Vec::new(),
            manager_flags: Vec::new(),
            common: [fast_heartbeats(), flags.clone()].concat(),
            tls: Some(pem),
        },
    );
    // A client trusting another CA: the handshake fails, and the message says why.
    let (code, _, err) = common::taskd(&[
        "status",
        "--addr",
        &c.control_addr,
        "--job",
        "tls-causes",
        "--tls-ca",
        &other[1],
    ]);
    assert_eq!(code, 3, "{err}");
    let cause = err.split("transport error").nth(1).unwrap_or_default();
    assert!(
        cause.len() > 2,
        "a cause under the transport's error: {err}"
    );
    c.shutdown_cleanly();
}
