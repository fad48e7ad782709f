package packet

import "testing"

func TestMAC(t *testing.T) {
	for _, c := range []struct {
		in   string
		want MAC
		ok   bool
	}{
		{"02:00:5e:10:00:01", MAC{2, 0, 0x5e, 0x10, 0, 1}, true},
		{"02-00-5E-10-00-0A", MAC{2, 0, 0x5e, 0x10, 0, 0x0a}, true},
		{"ff:ff:ff:ff:ff:ff", Broadcast, true},
		{"02:00:5e:10:00", MAC{}, false},
		{"02:00:5e:10:00:01:02", MAC{}, false},
		{"02:00-5e:10:00:01", MAC{}, false},
		{"02.00.5e.10.00.01", MAC{}, false},
		{"0g:00:5e:10:00:01", MAC{}, false},
		{"", MAC{}, false},
	} {
		got, err := ParseMAC(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("ParseMAC(%q) = %v, %v", c.in, got, err)
		}
	}
	m := MAC{0x02, 0xab, 0, 0x10, 0xff, 0x0c}
	if s := m.String(); s != "02:ab:00:10:ff:0c" {
		t.Errorf("String = %q", s)
	}
	if back, err := ParseMAC(m.String()); err != nil || back != m {
		t.Errorf("round trip: %v %v", back, err)
	}
	if !Broadcast.IsBroadcast() || !Broadcast.IsMulticast() || m.IsMulticast() || m.IsBroadcast() || m.IsZero() || !(MAC{}).IsZero() {
		t.Error("predicates")
	}
	if !(MAC{0x33, 0x33, 0, 0, 0, 1}).IsMulticast() {
		t.Error("33:33:00:00:00:01 is multicast")
	}
	text, err := m.MarshalText()
	var back MAC
	if err != nil || string(text) != "02:ab:00:10:ff:0c" || back.UnmarshalText(text) != nil || back != m {
		t.Errorf("text round trip: %q %v %v", text, err, back)
	}
	if err := back.UnmarshalText([]byte("nope")); err == nil || back != m {
		t.Errorf("UnmarshalText of a bad address: %v, changed to %v", err, back)
	}
}

func TestEncapModeString(t *testing.T) {
	if EncapGRE.String() != "gre" || EncapIPIP.String() != "ipip" || EncapMode(9).String() != "EncapMode(9)" {
		t.Error(EncapGRE, EncapIPIP, EncapMode(9))
	}
}
