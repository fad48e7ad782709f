package l7d

import (
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tiergate/tiergate/certs"
)

// ticketKeyAge watches the ticket keys in force for a rotation that has stopped: at
// start and after each reload (check) it warns when the newest key file is older than
// certificates.ticket_key_max_age, and as a collector it reports the newest key's age
// and that limit, so an alert can compare them between reloads.
type ticketKeyAge struct {
	// newest is the modification time of the newest key file in force, in Unix
	// nanoseconds; 0 without ticket key files.
	newest atomic.Int64
	maxAge atomic.Int64 // ticket_key_max_age in force, nanoseconds
	// now tells the time. Default time.Now.
	now func() time.Time
}

var (
	ticketKeyAgeDesc = prometheus.NewDesc("tiergate_l7_ticket_key_age_seconds",
		"Age of the newest session ticket key file in force (its modification time at the last start or reload); absent without ticket_key_files.", nil, nil)
	ticketKeyMaxAgeDesc = prometheus.NewDesc("tiergate_l7_ticket_key_max_age_seconds",
		"certificates.ticket_key_max_age: past it the newest ticket key is warned about as a rotation that has stopped.", nil, nil)
)

func (t *ticketKeyAge) clock() time.Time {
	if t.now != nil {
		return t.now()
	}
	return time.Now()
}

// check reads the age of the newest of cfg's ticket key files, keeps it for the
// metric and warns on log when it is over cfg's TicketKeyMaxAge. Without ticket key
// files it only forgets the previous ones. A file that cannot be examined is warned
// about: the keys were loaded, so that is no reason to refuse them.
func (t *ticketKeyAge) check(cfg certs.Config, log *slog.Logger) {
	t.maxAge.Store(int64(cfg.TicketKeyMaxAge))
	if len(cfg.TicketKeyFiles) == 0 {
		t.newest.Store(0)
		return
	}
	now := t.clock()
	age, err := certs.NewestTicketKeyAge(cfg.TicketKeyFiles, now)
	if err != nil {
		t.newest.Store(0)
		log.Warn("the age of the ticket keys is unknown", "err", err)
		return
	}
	t.newest.Store(now.Add(-age).UnixNano())
	if limit := cfg.TicketKeyMaxAge.D(); limit > 0 && age > limit {
		log.Warn("the newest ticket key is older than ticket_key_max_age: has rotation stopped? Put a new key first in ticket_key_files on every node and reload",
			"age", age.Round(time.Second), "ticket_key_max_age", limit, "ticket_key_files", cfg.TicketKeyFiles)
	}
}

func (t *ticketKeyAge) Describe(ch chan<- *prometheus.Desc) {
	ch <- ticketKeyAgeDesc
	ch <- ticketKeyMaxAgeDesc
}

func (t *ticketKeyAge) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(ticketKeyMaxAgeDesc, prometheus.GaugeValue, time.Duration(t.maxAge.Load()).Seconds())
	if n := t.newest.Load(); n != 0 {
		age := max(t.clock().Sub(time.Unix(0, n)), 0)
		ch <- prometheus.MustNewConstMetric(ticketKeyAgeDesc, prometheus.GaugeValue, age.Seconds())
	}
}
