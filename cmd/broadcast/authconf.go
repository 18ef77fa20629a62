package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/broadcastd/broadcast/internal/permissions"
)

// runAuthconf is `broadcast authconf`: it writes the servers' users and
// permissions (auth.conf at the repository root, which nats.conf and the
// cluster nodes include) or, with -nsc, the same users as nsc commands,
// both from the table in internal/permissions.
func runAuthconf(args []string) error {
	fs := flag.NewFlagSet("authconf", flag.ExitOnError)
	out := fs.String("o", "", "write to this file instead of standard output (auth.conf at the repository root)")
	nsc := fs.Bool("nsc", false, "print nsc commands that create the same users (decentralized authentication)")
	_ = fs.Parse(args)
	if fs.NArg() != 0 {
		return fmt.Errorf("usage: broadcast authconf [-o FILE] [-nsc]")
	}
	data := permissions.AuthConf()
	if *nsc {
		data = permissions.NSC()
	}
	if *out == "" {
		_, err := os.Stdout.Write(data)
		return err
	}
	return os.WriteFile(*out, data, 0o644)
}
