package store

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"

	"github.com/batonhq/baton/chaos/internal/record"
)

// ReadLog reads back a log written through WithLog: one record.Write per
// line. A last line cut short (a run stopped mid-write) is dropped; any
// other line that is not a write is an error naming its line number.
func ReadLog(r io.Reader) ([]record.Write, error) {
	var out []record.Write
	br := bufio.NewReader(r)
	for n := 1; ; n++ {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 && line[len(line)-1] == '\n' {
			var w record.Write
			if jerr := json.Unmarshal(line, &w); jerr != nil {
				return out, fmt.Errorf("store: log line %d is not a write: %v", n, jerr)
			}
			out = append(out, w)
		}
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("store: reading the log at line %d: %w", n, err)
		}
	}
}
