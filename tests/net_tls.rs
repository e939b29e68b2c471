//! Mutual TLS between the processes of a job: every process presents a certificate signed by
//! the job's CA (generated here with rcgen) and trusts only that CA.

mod net_support;

use net_support::{fast_heartbeats, make_tls, Cluster, ClusterSpec, Scratch};
use taskd::actors::net::{AdminClient, TlsPem};
use taskd::core::operation::Outcome;
use taskd::core::GlobalRank;

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
    let r =
        c.rt.block_on(c.admin.run(&c.command(&[(1, 0, true)])))
            .unwrap();
    assert_eq!(r.outcome, Outcome::Succeeded, "{r:#?}");
    let st = c.rt.block_on(c.admin.status(0)).unwrap();
    assert_eq!(st.ranks_on_backup, [GlobalRank(2)]);

    // A client whose certificate another CA signed is refused by the manager...
    let (_, foreign) = make_tls(&scratch, "foreign");
    let stranger = TlsPem {
        ca: pem.ca.clone(),
        cert: foreign.cert,
        key: foreign.key,
        domain: None,
    };
    let refused = c.rt.block_on(async {
        let mut a = AdminClient::connect(&c.manager_addr, Some(&stranger)).await?;
        a.status(0).await
    });
    assert!(refused.is_err(), "a foreign certificate was accepted");
    // ... and so is one without TLS at all.
    let plain = c.rt.block_on(async {
        let mut a = AdminClient::connect(&c.manager_addr, None).await?;
        a.status(0).await
    });
    assert!(plain.is_err(), "a plaintext client was accepted");

    c.shutdown_cleanly();
}
