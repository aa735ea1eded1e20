package regional

import (
	"strconv"
	"strings"
	"sync"
)

// Redis Cluster splits keys into 16384 hash slots, and a script may only
// touch keys of one slot. A decision touches its state key and the store's
// birth marker, so on a cluster every slot has a marker of its own,
// SlotBornKey(slot), whose hash tag puts it in that slot: a node that
// restarts empty loses exactly the markers of the slots it served, and the
// scripts of those slots notice (policy.Fresh).

// ClusterSlots is the number of hash slots of a Redis Cluster.
const ClusterSlots = 16384

// KeySlot returns the hash slot of key as Redis Cluster computes it: the
// CRC16 (XMODEM) of its hash tag (the part between the first '{' and the
// next '}', when not empty) or of the whole key, modulo 16384.
func KeySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key)) % ClusterSlots
}

// SlotBornKey is the birth marker of hash slot slot on a cluster.
func SlotBornKey(slot int) string {
	return BornKey + ":{" + slotTags()[slot] + "}"
}

// slotTags holds, for every slot, the shortest base-36 string that hashes
// to it: the hash tag of that slot's birth marker.
var slotTags = sync.OnceValue(func() *[ClusterSlots]string {
	var tags [ClusterSlots]string
	for i, left := 0, ClusterSlots; left > 0; i++ {
		s := strconv.FormatInt(int64(i), 36)
		if slot := int(crc16(s)) % ClusterSlots; tags[slot] == "" {
			tags[slot] = s
			left--
		}
	}
	return &tags
})

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial 0), the checksum of
// Redis Cluster's key hashing.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
