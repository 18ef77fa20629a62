package main

import (
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/broadcastd/broadcast/internal/pki"
)

// runCerts writes the route certificates deploy/cluster's nodes use.
func runCerts(args []string) error {
	fs := flag.NewFlagSet("certs", flag.ContinueOnError)
	dir := fs.String("dir", "deploy/cluster/tls", "directory to write ca.pem, route-cert.pem and route-key.pem into")
	hosts := fs.String("hosts", "127.0.0.1,localhost", "comma-separated IP addresses and names the route certificate is valid for")
	days := fs.Int("days", 365, "days the certificates are valid")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *days < 1 {
		return fmt.Errorf("-days: must be at least 1, got %d", *days)
	}
	if err := pki.WriteRouteCerts(*dir, strings.Split(*hosts, ","), time.Duration(*days)*24*time.Hour); err != nil {
		return err
	}
	fmt.Printf("wrote %s/{%s,%s,%s} for %s, valid %d days\n", *dir, pki.CAFile, pki.CertFile, pki.KeyFile, *hosts, *days)
	return nil
}
