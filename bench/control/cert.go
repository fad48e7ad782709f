package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"fmt"
	"time"

	"github.com/tiergate/tiergate/bench/benchkit"
	"github.com/tiergate/tiergate/testkit/cluster"
)

// certSite is the server name of the certificates the cert phase uploads.
const certSite = "www.bench.test"

// cert is the certificate phase: a cluster of real processes from o.bin
// (testkit/cluster: controld on its embedded etcd, two keyserverd on SoftHSM2
// tokens, two l7d fed only by controld), and -cert-uploads uploads of a new
// version of one bound certificate, each timed from the upload's answer (201, the
// key imported into both keyservers and verified, the version stored) to both l7d
// serving it to a new TLS handshake (its serial seen by a client of each).
func (r *report) cert(ctx context.Context, dir string) error {
	o := r.opts
	start := time.Now()
	c, err := cluster.Start(ctx, cluster.Options{Bin: o.bin, Dir: dir})
	if err != nil {
		return err
	}
	defer c.Close()
	first, err := certVersion(c)
	if err != nil {
		return err
	}
	if _, _, err := c.Upload(ctx, "www", first); err != nil {
		return fmt.Errorf("uploading the first version: %w", err)
	}
	if err := c.WriteSite(ctx, "www", "bench\n"); err != nil {
		return err
	}
	for _, node := range []string{"l7-a", "l7-b"} {
		if _, err := c.AddL7(ctx, node); err != nil {
			return err
		}
	}
	if _, err := c.WaitServed(ctx, certSite, first.Serial(), 10*time.Second); err != nil {
		return err
	}
	fmt.Fprintf(o.log, "bench-control: cluster of controld, 2 keyserverd and 2 l7d up in %v\n", time.Since(start).Round(time.Millisecond))

	var lat []time.Duration
	var upload []time.Duration
	for i := range o.certUploads {
		v, err := certVersion(c)
		if err != nil {
			return err
		}
		sent := time.Now()
		if _, _, err := c.Upload(ctx, "www", v); err != nil {
			return fmt.Errorf("upload %d: %w", i+1, err)
		}
		upload = append(upload, time.Since(sent))
		took, err := c.WaitServed(ctx, certSite, v.Serial(), time.Duration(targetCertServedMs)*time.Millisecond*10)
		if err != nil {
			return fmt.Errorf("upload %d: %w", i+1, err)
		}
		lat = append(lat, took)
	}
	r.certLat = benchkit.NewLatencies(lat)
	r.certUpload = benchkit.NewLatencies(upload)
	r.certMs = ms(r.certLat.Percentile(50))
	return nil
}

// certVersion is a new version of the bench's certificate: a fresh P-256 key, a
// leaf for certSite signed by the cluster's site CA.
func certVersion(c *cluster.Cluster) (*cluster.SiteCert, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	return c.IssueSite(key, time.Time{}, time.Time{}, certSite)
}
