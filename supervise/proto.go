//go:build linux || darwin

package supervise

import (
	"encoding/binary"
	"fmt"
	"io"

	"golang.org/x/sys/unix"
)

// The parent and its guard talk over a Unix stream socket. Every message is
// one type byte and a big-endian int64; the string messages ('E', 'C', 'p',
// 'a', 'e') are followed by that many bytes of text.
const (
	// Parent to guard, before the command starts.
	msgGrace    = 'g' // grace in nanoseconds
	msgNoCgroup = 'n' // do not try cgroup v2
	msgRun      = 'r' // start the command now
	msgPath     = 'p' // length, then the command's file
	msgArg      = 'a' // length, then the next of its arguments (argv[0] first)
	msgEnv      = 'e' // length, then the next "KEY=value" of its environment

	// Parent to guard, while the command runs (msgDeadline also before).
	msgDeadline = 'D' // deadline: CLOCK_MONOTONIC nanoseconds; 0 none
	msgSignal   = 'S' // relay signal N to the command
	msgStop     = 'T' // stop: SIGTERM now, SIGKILL after the grace
	msgKill     = 'K' // SIGKILL everything now

	// Guard to parent.
	msgStartErr = 'E' // errno, then the error text; the guard exits
	msgCgroup   = 'C' // length, then the path of the command's cgroup
	msgStarted  = 'P' // the command's pid
	msgReason   = 'R' // the guard began stopping on its own: reason*
	msgExited   = 'X' // the command's exit code (128+N for signal N)
	msgGone     = 'G' // nothing below the guard is left; it exits next
)

// Why a guard began stopping the command on its own.
const (
	reasonDeadline   = 1 // the deadline passed unextended
	reasonParentGone = 2 // the parent's end of the socket closed
	reasonSignal     = 3 // the guard itself got SIGTERM or SIGINT
)

type message struct {
	typ byte
	val int64
	str string // the string messages
}

// maxString bounds the text of a message, so a corrupt stream cannot make
// the reader allocate without limit.
const maxString = 64 << 10

func readMessage(r io.Reader) (message, error) {
	var b [9]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return message{}, err
	}
	m := message{typ: b[0], val: int64(binary.BigEndian.Uint64(b[1:]))}
	if m.typ == msgStartErr {
		// errno, then a second header with the text's length
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return message{}, err
		}
		n := int64(binary.BigEndian.Uint64(b[1:]))
		s, err := readString(r, n)
		m.str = s
		return m, err
	}
	if m.typ == msgCgroup || m.typ == msgPath || m.typ == msgArg || m.typ == msgEnv {
		s, err := readString(r, m.val)
		m.str = s
		return m, err
	}
	return m, nil
}

func readString(r io.Reader, n int64) (string, error) {
	if n < 0 || n > maxString {
		return "", fmt.Errorf("supervise: bad string length %d in guard protocol", n)
	}
	buf := make([]byte, n)
	_, err := io.ReadFull(r, buf)
	return string(buf), err
}

func encode(typ byte, val int64) []byte {
	b := make([]byte, 9)
	b[0] = typ
	binary.BigEndian.PutUint64(b[1:], uint64(val))
	return b
}

func encodeString(typ byte, s string) []byte {
	return append(encode(typ, int64(len(s))), s...)
}

func encodeStartErr(errno int64, text string) []byte {
	if len(text) > maxString {
		text = text[:maxString]
	}
	return append(encode(msgStartErr, errno), encodeString(0, text)...)
}

// monotonicNow reads CLOCK_MONOTONIC, the clock Go's timers run on, which
// every process of the host shares: an absolute reading means the same
// instant to the parent and the guard, so a deadline in transit does not
// stretch. On macOS it also counts time asleep, which Go's own clock may
// not: a Mac's sleep brings the guard's deadline closer, never further.
func monotonicNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		// CLOCK_MONOTONIC always exists on Linux and macOS.
		panic("supervise: clock_gettime(CLOCK_MONOTONIC): " + err.Error())
	}
	return ts.Nano()
}
