package server

import (
	"context"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/cohort-dev/cohort/internal/apierr"
)

// noNUL refuses a Connect request with a NUL character in any string
// (400, naming the field). Protobuf already insists on UTF-8; NUL is valid
// UTF-8 but no identifier or name holds one, PostgreSQL refuses it as text
// and SQLite's parser stops at it (bun writes arguments into the SQL
// text): without this, an id with a NUL was a 500. The REST doors' ids
// come from paths and bodies their own checks refuse.
type noNUL struct{}

func (noNUL) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if m, ok := req.Any().(proto.Message); ok {
			if err := checkNUL(m.ProtoReflect()); err != nil {
				return nil, err
			}
		}
		return next(ctx, req)
	}
}

func (noNUL) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (noNUL) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		return next(ctx, nulConn{conn})
	}
}

type nulConn struct{ connect.StreamingHandlerConn }

func (c nulConn) Receive(msg any) error {
	if err := c.StreamingHandlerConn.Receive(msg); err != nil {
		return err
	}
	if m, ok := msg.(proto.Message); ok {
		return checkNUL(m.ProtoReflect())
	}
	return nil
}

// checkNUL walks every populated field of m.
func checkNUL(m protoreflect.Message) error {
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		err = checkValue(fd, v)
		return err == nil
	})
	return err
}

func checkValue(fd protoreflect.FieldDescriptor, v protoreflect.Value) error {
	switch {
	case fd.IsList():
		l := v.List()
		for i := range l.Len() {
			if err := checkScalar(fd, l.Get(i)); err != nil {
				return err
			}
		}
		return nil
	case fd.IsMap():
		var err error
		v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
			if strings.ContainsRune(k.String(), 0) {
				err = nulError(fd)
			} else {
				err = checkScalar(fd.MapValue(), mv)
			}
			return err == nil
		})
		return err
	}
	return checkScalar(fd, v)
}

func checkScalar(fd protoreflect.FieldDescriptor, v protoreflect.Value) error {
	switch fd.Kind() {
	case protoreflect.StringKind:
		if strings.ContainsRune(v.String(), 0) {
			return nulError(fd)
		}
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return checkNUL(v.Message())
	}
	return nil
}

func nulError(fd protoreflect.FieldDescriptor) error {
	return apierr.BadRequest("field %q must not contain NUL characters", fd.JSONName())
}
