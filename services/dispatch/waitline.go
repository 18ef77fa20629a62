package dispatch

// waitLine is one lane's tickets waiting for a turn, first come first
// served. A ticket whose wait ends without a grant leaves the line in
// count at once but stays in the slice until it reaches the front, or
// takes its place back when it waits again: taking it out of the middle
// was a search and a copy of the line on every timeout, 6 % of a
// 3-account benchmark's CPU with thousands of jobs waiting per account.
// Call its methods with the scheduler's lock held.
type waitLine struct {
	tickets []*ticket // in arrival order, some of them gone from the line
	n       int       // tickets in line
}

// len is the number of tickets in line.
func (l *waitLine) len() int { return l.n }

// join puts t in line: at the back, or where it stood if it is still in
// the slice.
func (l *waitLine) join(t *ticket) {
	if t.inLine {
		return
	}
	t.inLine = true
	l.n++
	if t.listed {
		return
	}
	t.listed = true
	l.tickets = append(l.tickets, t)
	if len(l.tickets) > 64 && len(l.tickets) > 2*l.n {
		l.compact()
	}
}

// leave takes t out of line; its slot in the slice is dropped later.
func (l *waitLine) leave(t *ticket) {
	if t.inLine {
		t.inLine = false
		l.n--
	}
}

// front returns the first ticket in line, nil when none is, dropping the
// tickets gone from the line before it.
func (l *waitLine) front() *ticket {
	for len(l.tickets) > 0 {
		t := l.tickets[0]
		if t.inLine {
			return t
		}
		l.drop()
	}
	return nil
}

// pop takes the first ticket in line out of it, nil when none is.
func (l *waitLine) pop() *ticket {
	t := l.front()
	if t != nil {
		l.leave(t)
		l.drop()
	}
	return t
}

// drop removes the slice's first ticket.
func (l *waitLine) drop() {
	l.tickets[0].listed = false
	l.tickets[0] = nil
	l.tickets = l.tickets[1:]
}

// compact removes the tickets gone from the line, so tickets that left and
// never came back (their jobs handled otherwise) do not pile up behind a
// lane that is not served.
func (l *waitLine) compact() {
	kept := l.tickets[:0]
	for _, t := range l.tickets {
		if t.inLine {
			kept = append(kept, t)
		} else {
			t.listed = false
		}
	}
	clear(l.tickets[len(kept):])
	l.tickets = kept
}
