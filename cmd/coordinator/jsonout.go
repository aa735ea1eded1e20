package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/quota-lease/quota-lease/policy"
)

// The one JSON style of every -o json (docs/cli.md): keys in snake_case,
// numbers as JSON numbers in stated units (quantities in units, not
// micro-units), policies as objects, enums as lower-case words, indented.

// microFields are the fields, by message, that the wire carries in
// micro-units and -o json shows in units.
var microFields = map[protoreflect.FullName]map[protoreflect.Name]bool{
	"quotalease.v1.LeaseRecord": {"rate": true, "enforcing": true, "reserved": true, "demand": true, "limit": true},
	"quotalease.v1.EdgeSummary": {"assigned": true, "usage": true},
}

// renamedFields are fields whose JSON key says better what they hold.
var renamedFields = map[protoreflect.FullName]map[protoreflect.Name]string{
	// What one ideal global limiter admits per window, not the policy's limit.
	"quotalease.v1.BoundRecord": {"limit": "reference"},
}

// printJSON writes m in the one style.
func printJSON(w io.Writer, m proto.Message) error {
	v, err := jsonValue(m.ProtoReflect())
	if err != nil {
		return err
	}
	return writeJSON(w, v)
}

func writeJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}

// jsonValue turns a message into a map of its fields (all of them, zero
// values too, so scripts see every key).
func jsonValue(m protoreflect.Message) (map[string]any, error) {
	out := map[string]any{}
	fields := m.Descriptor().Fields()
	micro := microFields[m.Descriptor().FullName()]
	renamed := renamedFields[m.Descriptor().FullName()]
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		name := string(fd.Name())
		if r, ok := renamed[fd.Name()]; ok {
			name = r
		}
		val := m.Get(fd)
		switch {
		case fd.IsList():
			list := make([]any, 0, val.List().Len())
			for j := 0; j < val.List().Len(); j++ {
				e, err := scalar(fd, val.List().Get(j), false)
				if err != nil {
					return nil, err
				}
				list = append(list, e)
			}
			out[name] = list
		case fd.IsMap():
			mm := map[string]any{}
			var err error
			val.Map().Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
				var e any
				e, err = scalar(fd.MapValue(), v, false)
				mm[k.String()] = e
				return err == nil
			})
			if err != nil {
				return nil, err
			}
			out[name] = mm
		case name == "json" && fd.Kind() == protoreflect.StringKind:
			// A stored policy: an object, under the key "policy".
			var p policy.Policy
			if err := json.Unmarshal([]byte(val.String()), &p); err != nil {
				return nil, fmt.Errorf("stored policy: %w", err)
			}
			out["policy"] = p
		default:
			e, err := scalar(fd, val, micro[fd.Name()])
			if err != nil {
				return nil, err
			}
			out[name] = e
		}
	}
	return out, nil
}

// scalar is one field value in the style; micro values become units.
func scalar(fd protoreflect.FieldDescriptor, v protoreflect.Value, micro bool) (any, error) {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return jsonValue(v.Message())
	case protoreflect.EnumKind:
		ev := fd.Enum().Values().ByNumber(v.Enum())
		if ev == nil {
			return v.Enum(), nil
		}
		return strings.ToLower(string(ev.Name())), nil
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind,
		protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		if micro {
			return policy.Units(v.Int()), nil
		}
		return v.Int(), nil
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind, protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return v.Uint(), nil
	case protoreflect.DoubleKind, protoreflect.FloatKind:
		if f := v.Float(); math.IsInf(f, 0) || math.IsNaN(f) {
			return nil, nil // JSON has no infinity: an unbounded worst case is null
		}
		return v.Float(), nil
	case protoreflect.BoolKind:
		return v.Bool(), nil
	case protoreflect.StringKind:
		return v.String(), nil
	case protoreflect.BytesKind:
		return v.Bytes(), nil
	}
	return nil, fmt.Errorf("field %s: kind %s has no JSON form here", fd.FullName(), fd.Kind())
}
