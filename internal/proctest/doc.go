// Package proctest runs Broadcast as separate OS processes for tests:
// nats-server, the services (`broadcast ingest|render|dispatch|status`) and
// the fault-injecting gateway, each a Proc that a test can kill -9, stop and
// restart.
//
// BuildBinaries builds the executables once per test binary; StartNATS,
// RunSetup, StartService and StartGateway call it themselves. RunSetup runs
// `broadcast setup` to completion: the services only wait for the topology
// it creates. Every process runs in its own process group with its output
// in a log file under t.TempDir(); all of them are killed when the test
// ends, pass or fail, and a failed test prints the tail of each log.
//
//	ns := proctest.StartNATS(t, t.TempDir(), 0)
//	_, err := proctest.RunSetup(t, "NATS_URL="+ns.URL)
//	gw := proctest.StartGateway(t, "-fail-rate", "0.05")
//	d := proctest.StartService(t, "dispatch", "NATS_URL="+ns.URL)
//	d.WaitLog("dispatch started", 10*time.Second)
//	d.Kill()
//	d.Restart()
//
// The in-process harnesses are natstest (servers) and pipelinetest (the
// services); use proctest where the process boundary is the point:
// crashes, restarts, signals, real binaries.
package proctest
